//! The recovery rate limit: a token bucket whose tokens are time, kept free of
//! clocks (the caller passes `now`) so its arithmetic is unit-tested.
//!
//! The bucket holds the time at which the budget is spent up to (`next`). Taking
//! `cost` moves it forward by `cost` from `max(next, now - burst)`: a caller idle for
//! a while may spend up to `burst` of saved-up budget at once, never more. The
//! caller waits `next - now` when that is positive. (The first version computed its
//! floor as `now - min(burst, now.elapsed())`, and `now.elapsed()` is about zero, so
//! nothing was ever carried over, contrary to its comment.)
use std::time::Duration;
use tokio::time::Instant;

/// A time-based token bucket.
#[derive(Debug)]
pub struct TokenBucket {
    next: Instant,
    burst: Duration,
}

impl TokenBucket {
    /// A bucket that starts full at `now` and saves up at most `burst` of unused budget.
    pub fn new(now: Instant, burst: Duration) -> Self {
        TokenBucket {
            next: now.checked_sub(burst).unwrap_or(now),
            burst,
        }
    }

    /// Take `cost` at `now`; returns how long the caller must wait before going on.
    pub fn take(&mut self, now: Instant, cost: Duration) -> Duration {
        let floor = now.checked_sub(self.burst).unwrap_or(now);
        self.next = self.next.max(floor) + cost;
        self.next.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn test_unused_budget_is_carried_over_up_to_the_burst_and_no_more() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(t0, 1000 * MS);
        // Full at the start: one second of budget goes without waiting ...
        assert_eq!(b.take(t0, 600 * MS), Duration::ZERO);
        assert_eq!(b.take(t0, 400 * MS), Duration::ZERO);
        // ... and the next 100 ms of cost waits 100 ms.
        assert_eq!(b.take(t0, 100 * MS), 100 * MS);
        // Idle for 500 ms after being 100 ms in debt: 400 ms saved up.
        let t1 = t0 + 500 * MS;
        assert_eq!(b.take(t1, 400 * MS), Duration::ZERO);
        assert_eq!(b.take(t1, 50 * MS), 50 * MS);
        // Idle for an hour: still only one second saved up.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!(b.take(t2, 1000 * MS), Duration::ZERO);
        assert_eq!(b.take(t2, 250 * MS), 250 * MS);
    }

    #[test]
    fn test_the_long_run_rate_is_the_cost_rate() {
        // 100 takes of 10 ms each, asked for all at once, end 1 s - burst later.
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(t0, 200 * MS);
        let waits: Vec<Duration> = (0..100).map(|_| b.take(t0, 10 * MS)).collect();
        assert_eq!(waits[19], Duration::ZERO);
        assert_eq!(waits[20], 10 * MS);
        assert_eq!(*waits.last().unwrap(), 800 * MS);
    }
}
