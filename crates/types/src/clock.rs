//! The one clock every lease, deadline and time stamp in drove reads.
//!
//! - [`Instant`] is tokio's: the simulator pauses tokio's clock and moves it
//!   straight to the next timer, so a lease, a deadline or a wait measured with it
//!   runs on simulated time there and on the monotonic clock in production (tokio's
//!   `Instant` is std's until a runtime pauses its clock).
//! - [`unix_ms`] is the wall clock that lease stamps and the metadata's own clock
//!   read: `SystemTime` in production; on a thread where the simulator called
//!   [`simulate_wall`], the simulated wall clock (a start time plus tokio's time
//!   since), which moves with the simulated one and never with the host's.
//!
//! Code that must measure real time whatever runs it (a benchmark's wall time, a
//! progress line) uses `std::time::Instant` by name.
use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

pub use tokio::time::Instant;

thread_local! {
    /// The simulated wall clock of this thread: milliseconds since the Unix epoch
    /// at the tokio instant beside them.
    static SIMULATED: Cell<Option<(u64, Instant)>> = const { Cell::new(None) };
}

/// Milliseconds since the Unix epoch on this node's wall clock (0 if the clock is
/// before 1970).
pub fn unix_ms() -> u64 {
    if let Some((base, at)) = SIMULATED.with(Cell::get) {
        let since = Instant::now().saturating_duration_since(at);
        return base.saturating_add(u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Seconds since the Unix epoch on this node's wall clock.
pub fn unix_secs() -> u64 {
    unix_ms() / 1000
}

/// From now on and until [`real_wall`], [`unix_ms`] on this thread reads `base_ms`
/// plus tokio's time since this call: the simulator's wall clock. Call it inside
/// the simulated runtime, after its clock is paused.
pub fn simulate_wall(base_ms: u64) {
    SIMULATED.with(|s| s.set(Some((base_ms, Instant::now()))));
}

/// [`unix_ms`] on this thread reads the host's wall clock again.
pub fn real_wall() {
    SIMULATED.with(|s| s.set(None));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn test_the_simulated_wall_clock_moves_with_tokios_paused_clock_only() {
        simulate_wall(1_000_000);
        assert_eq!(unix_ms(), 1_000_000);
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!(unix_ms(), 1_002_500);
        assert_eq!(unix_secs(), 1_002);
        real_wall();
        // The host's clock: well past 2020-01-01.
        assert!(unix_ms() > 1_577_836_800_000);
    }

    #[test]
    fn test_the_wall_clock_is_the_hosts_without_a_simulation() {
        let host = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(unix_ms().abs_diff(host) < 5_000);
    }
}
