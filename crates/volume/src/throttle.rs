//! A VDI's I/O limits ([`Qos`]) where its clients attach: one token bucket per
//! limit (read and write IOPS, read and write bytes/s), shared by every client
//! of the VDI on this node. A bucket fills at its limit's rate up to `burst`
//! worth; a request takes its tokens at once, even into debt, and waits until the
//! debt is paid: requests queued behind it wait longer, so the rate holds under any
//! queue depth and a request bigger than the burst still passes (at the rate).
//! New limits take effect at the next request (tokens kept, capped at the new
//! burst). Time is tokio's clock, which the simulator controls.
use drove_types::Qos;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Which way a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A read.
    Read,
    /// A write, zeroes or a trim.
    Write,
}

/// One limit's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens per second.
    rate: f64,
    /// Tokens now (negative: debt being paid).
    tokens: f64,
}

impl Bucket {
    fn new(rate: u64, burst_s: f64) -> Bucket {
        let rate = rate as f64;
        Bucket {
            rate,
            tokens: rate * burst_s,
        }
    }

    /// Fill for `elapsed`, up to `burst_s` worth; take `n`; how long until the
    /// debt (if any) is paid.
    fn take(&mut self, elapsed: f64, burst_s: f64, n: f64) -> f64 {
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate * burst_s);
        self.tokens -= n;
        if self.tokens >= 0.0 {
            0.0
        } else {
            -self.tokens / self.rate
        }
    }
}

#[derive(Debug)]
struct Buckets {
    qos: Qos,
    at: Instant,
    read_iops: Option<Bucket>,
    write_iops: Option<Bucket>,
    read_bps: Option<Bucket>,
    write_bps: Option<Bucket>,
}

impl Buckets {
    fn new(qos: Qos) -> Buckets {
        let burst_s = f64::from(qos.burst_ms()) / 1000.0;
        let b = |limit: Option<u64>| limit.map(|r| Bucket::new(r, burst_s));
        Buckets {
            qos,
            at: Instant::now(),
            read_iops: b(qos.read_iops),
            write_iops: b(qos.write_iops),
            read_bps: b(qos.read_bps),
            write_bps: b(qos.write_bps),
        }
    }

    /// Take new limits, keeping the tokens of a limit that stays (capped at its
    /// new burst) so a change does not hand out a fresh burst.
    fn set(&mut self, qos: Qos) {
        if qos == self.qos {
            return;
        }
        let mut new = Buckets::new(qos);
        new.at = self.at;
        let keep = |old: Option<Bucket>, new: &mut Option<Bucket>| {
            if let (Some(o), Some(n)) = (old, new.as_mut()) {
                n.tokens = o.tokens.min(n.tokens);
            }
        };
        keep(self.read_iops, &mut new.read_iops);
        keep(self.write_iops, &mut new.write_iops);
        keep(self.read_bps, &mut new.read_bps);
        keep(self.write_bps, &mut new.write_bps);
        *self = new;
    }
}

/// The buckets of one VDI on this node, and the time its requests waited.
#[derive(Debug)]
pub struct Throttle {
    buckets: Mutex<Buckets>,
    /// Nanoseconds reads waited for their limits, in all.
    read_waited_ns: AtomicU64,
    /// Nanoseconds writes waited for their limits, in all.
    write_waited_ns: AtomicU64,
}

impl Throttle {
    /// Buckets for `qos`, full.
    pub fn new(qos: Qos) -> Throttle {
        Throttle {
            buckets: Mutex::new(Buckets::new(qos)),
            read_waited_ns: AtomicU64::new(0),
            write_waited_ns: AtomicU64::new(0),
        }
    }

    /// Hold requests to `qos` from now on.
    pub fn set(&self, qos: Qos) {
        self.buckets.lock().set(qos);
    }

    /// The limits held to.
    pub fn qos(&self) -> Qos {
        self.buckets.lock().qos
    }

    /// How long a request of `bytes` bytes going `dir` must wait for its limits;
    /// its tokens are taken.
    pub fn reserve(&self, dir: Direction, bytes: u64) -> Duration {
        let mut guard = self.buckets.lock();
        let b = &mut *guard;
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.at = now;
        let burst_s = f64::from(b.qos.burst_ms()) / 1000.0;
        let (iops, bps) = match dir {
            Direction::Read => (&mut b.read_iops, &mut b.read_bps),
            Direction::Write => (&mut b.write_iops, &mut b.write_bps),
        };
        // Both buckets fill for the time gone by, even one the request does not
        // take from (zeroes carry no bytes).
        let mut wait: f64 = 0.0;
        if let Some(bucket) = iops {
            wait = wait.max(bucket.take(elapsed, burst_s, 1.0));
        }
        if let Some(bucket) = bps {
            wait = wait.max(bucket.take(elapsed, burst_s, bytes as f64));
        }
        Duration::from_secs_f64(wait)
    }

    /// Wait until a request of `bytes` bytes going `dir` is within the limits;
    /// how long it waited.
    pub async fn admit(&self, dir: Direction, bytes: u64) -> Duration {
        let wait = self.reserve(dir, bytes);
        if wait.is_zero() {
            return wait;
        }
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        match dir {
            Direction::Read => &self.read_waited_ns,
            Direction::Write => &self.write_waited_ns,
        }
        .fetch_add(ns, Ordering::Relaxed);
        tokio::time::sleep(wait).await;
        wait
    }

    /// Seconds reads and writes waited for their limits so far: (read, write).
    pub fn waited_s(&self) -> (f64, f64) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        (s(&self.read_waited_ns), s(&self.write_waited_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(write_iops: Option<u64>, write_bps: Option<u64>, burst_ms: u32) -> Qos {
        Qos {
            write_iops,
            write_bps,
            burst_ms: Some(burst_ms),
            ..Qos::default()
        }
    }

    /// Requests sent back to back for `secs` (each waits its turn): how many passed.
    async fn passed_in(t: &Throttle, dir: Direction, bytes: u64, secs: u64) -> u64 {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut n = 0;
        while Instant::now() < end {
            t.admit(dir, bytes).await;
            n += 1;
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn test_iops_hold_to_the_limit_after_the_burst() {
        let t = Throttle::new(limits(Some(100), None, 1000));
        // The first second spends the burst (100) and the second's fill (100).
        let n = passed_in(&t, Direction::Write, 4096, 10).await;
        assert!((1095..=1105).contains(&n), "{n}");
        // Reads have no limit: they never wait.
        let before = Instant::now();
        for _ in 0..10_000 {
            t.admit(Direction::Read, 4096).await;
        }
        assert_eq!(Instant::now(), before);
        let (r, w) = t.waited_s();
        assert_eq!(r, 0.0);
        assert!(w > 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn test_bytes_hold_to_the_limit_and_big_requests_pass_at_the_rate() {
        // 1 MiB/s, requests of 4 MiB: one every 4 s once the burst is spent.
        let t = Throttle::new(limits(None, Some(1 << 20), 1000));
        let n = passed_in(&t, Direction::Write, 4 << 20, 20).await;
        assert!((5..=6).contains(&n), "{n}");
    }

    #[tokio::test(start_paused = true)]
    async fn test_a_new_limit_holds_at_the_next_request_without_a_fresh_burst() {
        let t = Throttle::new(limits(Some(100), None, 1000));
        passed_in(&t, Direction::Write, 0, 3).await;
        t.set(limits(Some(400), None, 1000));
        let n = passed_in(&t, Direction::Write, 0, 5).await;
        // 5 s at 400/s, plus at most one request's worth of rounding: no new burst
        // of 400 on top.
        assert!((1995..=2005).contains(&n), "{n}");
        // Lifted: no wait at all.
        t.set(Qos::default());
        let before = Instant::now();
        for _ in 0..1000 {
            t.admit(Direction::Write, 4096).await;
        }
        assert_eq!(Instant::now(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn test_concurrent_clients_share_the_limit() {
        let t = std::sync::Arc::new(Throttle::new(limits(Some(200), None, 100)));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let t = t.clone();
            tasks.push(tokio::spawn(async move {
                passed_in(&t, Direction::Write, 4096, 10).await
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap();
        }
        // 10 s at 200/s plus a burst of 20, over all eight.
        assert!((2010..=2030).contains(&total), "{total}");
    }
}
