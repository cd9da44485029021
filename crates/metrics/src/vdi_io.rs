//! Live I/O per VDI on this gateway: operations, bytes, errors and a latency
//! histogram for reads and for writes, counted where every frontend's requests meet
//! the volume (the daemon's export), and read as cumulative samples.
//!
//! `drove vdi iostat` asks every node for its samples twice and shows the
//! difference over the interval; the node's own Prometheus exposition shows the top
//! VDIs by load over its last window (see [`VdiIoTable::window`]), so the number of
//! series stays bounded whatever the number of VDIs.
//!
//! Latency buckets double from 8 us: bucket `i` holds requests that took less than
//! `8 us * 2^i` (and at least the bucket before's bound); the last one holds every
//! slower request. A quantile is given as the upper bound of the bucket it falls in,
//! so it is at most twice the true value.
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Number of latency buckets (8 us up to about 34 s, then one for everything slower).
pub const BUCKETS: usize = 24;

/// The smallest bucket's upper bound, in seconds.
const FIRST_BOUND: f64 = 8e-6;

/// How long a VDI no frontend holds any more keeps its counters.
const IDLE_KEPT: Duration = Duration::from_secs(300);

/// The upper bound of latency bucket `i`, in seconds (infinite for the last).
pub fn bucket_bound(i: usize) -> f64 {
    if i + 1 >= BUCKETS {
        f64::INFINITY
    } else {
        FIRST_BOUND * f64::from(1u32 << i)
    }
}

/// The bucket a request that took `secs` falls in.
fn bucket(secs: f64) -> usize {
    (0..BUCKETS - 1)
        .find(|&i| secs < bucket_bound(i))
        .unwrap_or(BUCKETS - 1)
}

/// The counters of one kind of operation.
#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency: [AtomicU64; BUCKETS],
}

impl Counters {
    fn record(&self, bytes: u64, secs: f64, ok: bool) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if ok {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency[bucket(secs)].fetch_add(1, Ordering::Relaxed);
    }

    fn sample(&self) -> OpSample {
        OpSample {
            ops: self.ops.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            latency: self
                .latency
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

/// The I/O of one VDI through this gateway, shared by every connection to it.
#[derive(Default)]
pub struct VdiIo {
    read: Counters,
    write: Counters,
    flushes: AtomicU64,
    /// Microseconds requests waited for the VDI's I/O limits (QoS), summed.
    throttled_us: AtomicU64,
    /// Seconds since the table was made, at the last request (for pruning).
    last_use: AtomicU64,
}

impl VdiIo {
    /// A read of `bytes` that took `secs` (`ok`: it succeeded).
    pub fn read(&self, bytes: u64, secs: f64, ok: bool) {
        self.read.record(bytes, secs, ok);
    }

    /// A write (data, zeroes or a trim) of `bytes` that took `secs`.
    pub fn write(&self, bytes: u64, secs: f64, ok: bool) {
        self.write.record(bytes, secs, ok);
    }

    /// A flush.
    pub fn flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// A request waited `waited` for the VDI's I/O limits before it ran.
    pub fn throttled(&self, waited: Duration) {
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.throttled_us.fetch_add(us, Ordering::Relaxed);
    }

    fn sample(&self, vdi: &str) -> VdiIoSample {
        VdiIoSample {
            vdi: vdi.to_string(),
            read: self.read.sample(),
            write: self.write.sample(),
            flushes: self.flushes.load(Ordering::Relaxed),
            throttled_us: self.throttled_us.load(Ordering::Relaxed),
        }
    }
}

/// One kind of operation's cumulative counters (or their difference over an
/// interval, from [`OpSample::since`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSample {
    /// Requests, failed ones included.
    pub ops: u64,
    /// Bytes of the requests that succeeded.
    pub bytes: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Requests per latency bucket ([`bucket_bound`]).
    pub latency: Vec<u64>,
}

impl OpSample {
    /// What happened between `earlier` and this sample. Counters that went back (the
    /// node restarted, or the VDI's counters were dropped while idle) count from
    /// zero.
    pub fn since(&self, earlier: &OpSample) -> OpSample {
        let reset = self.went_back(earlier);
        let d = |now: u64, then: u64| if reset { now } else { now.saturating_sub(then) };
        OpSample {
            ops: d(self.ops, earlier.ops),
            bytes: d(self.bytes, earlier.bytes),
            errors: d(self.errors, earlier.errors),
            latency: self
                .latency
                .iter()
                .enumerate()
                .map(|(i, &n)| d(n, earlier.latency.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }

    /// Whether a counter is smaller than in `earlier`: these were counted afresh.
    fn went_back(&self, earlier: &OpSample) -> bool {
        self.ops < earlier.ops
            || self.bytes < earlier.bytes
            || self.errors < earlier.errors
            || self
                .latency
                .iter()
                .zip(&earlier.latency)
                .any(|(now, then)| now < then)
    }

    /// Add `other`'s counts to these (the same VDI through several gateways).
    pub fn add(&mut self, other: &OpSample) {
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.errors += other.errors;
        if self.latency.len() < other.latency.len() {
            self.latency.resize(other.latency.len(), 0);
        }
        for (a, b) in self.latency.iter_mut().zip(&other.latency) {
            *a += b;
        }
    }

    /// The latency below which a share `q` (0 to 1) of the requests finished, in
    /// seconds, as its bucket's upper bound; `None` without requests.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank of the request at quantile q, 1-based.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bucket_bound(i));
            }
        }
        Some(f64::INFINITY)
    }
}

/// One VDI's cumulative I/O through one gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiIoSample {
    /// The VDI's name.
    pub vdi: String,
    /// Reads.
    pub read: OpSample,
    /// Writes: data, zeroes and trims.
    pub write: OpSample,
    /// Flushes.
    pub flushes: u64,
    /// Microseconds requests waited for the VDI's I/O limits, summed over the
    /// requests (two waiting at once count twice). Absent from a node before
    /// 2026-11-29: 0.
    #[serde(default)]
    pub throttled_us: u64,
}

impl VdiIoSample {
    /// What happened between `earlier` (the same VDI's sample) and this one.
    pub fn since(&self, earlier: &VdiIoSample) -> VdiIoSample {
        let reset = self.read.went_back(&earlier.read)
            || self.write.went_back(&earlier.write)
            || self.flushes < earlier.flushes
            || self.throttled_us < earlier.throttled_us;
        let d = |now: u64, then: u64| if reset { now } else { now.saturating_sub(then) };
        VdiIoSample {
            vdi: self.vdi.clone(),
            read: self.read.since(&earlier.read),
            write: self.write.since(&earlier.write),
            flushes: d(self.flushes, earlier.flushes),
            throttled_us: d(self.throttled_us, earlier.throttled_us),
        }
    }

    /// Add `other`'s counts (the same VDI through another gateway).
    pub fn add(&mut self, other: &VdiIoSample) {
        self.read.add(&other.read);
        self.write.add(&other.write);
        self.flushes += other.flushes;
        self.throttled_us += other.throttled_us;
    }

    /// Requests of both kinds.
    pub fn ops(&self) -> u64 {
        self.read.ops + self.write.ops
    }

    /// Bytes of both kinds.
    pub fn bytes(&self) -> u64 {
        self.read.bytes + self.write.bytes
    }
}

/// Every VDI's I/O through this gateway.
pub struct VdiIoTable {
    vdis: Mutex<BTreeMap<String, Arc<VdiIo>>>,
    started: std::time::Instant,
    /// The samples at the start of the window [`VdiIoTable::window`] last closed.
    window: Mutex<BTreeMap<String, VdiIoSample>>,
}

impl Default for VdiIoTable {
    fn default() -> Self {
        VdiIoTable {
            vdis: Mutex::default(),
            started: std::time::Instant::now(),
            window: Mutex::default(),
        }
    }
}

impl VdiIoTable {
    /// The counters of VDI `vdi`, made on first use. A frontend holds the `Arc` while
    /// the VDI is attached through it.
    pub fn vdi(&self, vdi: &str) -> Arc<VdiIo> {
        let io = self.vdis.lock().entry(vdi.to_string()).or_default().clone();
        io.last_use
            .store(self.started.elapsed().as_secs(), Ordering::Relaxed);
        io
    }

    /// Every VDI's cumulative counters, by name. A VDI no frontend holds that has been
    /// idle for 5 minutes is dropped first.
    pub fn samples(&self) -> Vec<VdiIoSample> {
        let now = self.started.elapsed().as_secs();
        let mut vdis = self.vdis.lock();
        vdis.retain(|_, io| {
            Arc::strong_count(io) > 1
                || now.saturating_sub(io.last_use.load(Ordering::Relaxed)) < IDLE_KEPT.as_secs()
        });
        vdis.iter().map(|(name, io)| io.sample(name)).collect()
    }

    /// Close the current window: what each VDI did since the last call, busiest first.
    pub fn window(&self) -> Vec<VdiIoSample> {
        let now = self.samples();
        let mut window = self.window.lock();
        let mut out: Vec<VdiIoSample> = now
            .iter()
            .map(|s| match window.get(&s.vdi) {
                Some(before) => s.since(before),
                None => s.clone(),
            })
            .collect();
        *window = now.into_iter().map(|s| (s.vdi.clone(), s)).collect();
        out.sort_by(|a, b| b.ops().cmp(&a.ops()).then(a.vdi.cmp(&b.vdi)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_latencies_fall_in_doubling_buckets() {
        assert_eq!(bucket(0.0), 0);
        assert_eq!(bucket(7e-6), 0);
        assert_eq!(bucket(8e-6), 1);
        assert_eq!(bucket(100e-6), 4); // 64 us <= 100 us < 128 us
        assert_eq!(bucket(1e9), BUCKETS - 1);
        assert!(bucket_bound(BUCKETS - 2) > 30.0);
    }

    #[test]
    fn test_quantiles_are_the_bounds_of_the_buckets_they_fall_in() {
        let t = VdiIoTable::default();
        let io = t.vdi("a");
        for _ in 0..98 {
            io.write(4096, 100e-6, true);
        }
        io.write(4096, 3e-3, true);
        io.write(0, 3e-3, false);
        let s = &t.samples()[0];
        assert_eq!(
            (s.write.ops, s.write.bytes, s.write.errors),
            (100, 99 * 4096, 1)
        );
        assert_eq!(s.write.quantile(0.5), Some(128e-6));
        assert_eq!(s.write.quantile(0.98), Some(128e-6));
        assert_eq!(s.write.quantile(0.99), Some(4.096e-3));
        assert_eq!(s.read.quantile(0.5), None);
    }

    #[test]
    fn test_an_interval_is_the_difference_and_a_reset_counts_from_zero() {
        let t = VdiIoTable::default();
        let io = t.vdi("a");
        io.read(4096, 1e-4, true);
        let before = t.samples()[0].clone();
        io.read(4096, 1e-4, true);
        io.read(8192, 1e-4, true);
        io.flush();
        let d = t.samples()[0].since(&before);
        assert_eq!((d.read.ops, d.read.bytes, d.flushes), (2, 12288, 1));
        // A restarted node's counters are smaller: they are the interval's.
        let fresh = VdiIoTable::default();
        fresh.vdi("a").read(512, 1e-4, true);
        let d = fresh.samples()[0].since(&before);
        assert_eq!((d.read.ops, d.read.bytes), (1, 512));
    }

    #[test]
    fn test_the_window_lists_the_busiest_first_and_restarts_each_time() {
        let t = VdiIoTable::default();
        let (a, b) = (t.vdi("a"), t.vdi("b"));
        a.write(4096, 1e-4, true);
        for _ in 0..3 {
            b.read(4096, 1e-4, true);
        }
        let w = t.window();
        assert_eq!(
            w.iter()
                .map(|s| (s.vdi.as_str(), s.ops()))
                .collect::<Vec<_>>(),
            [("b", 3), ("a", 1)]
        );
        a.write(4096, 1e-4, true);
        let w = t.window();
        assert_eq!(
            w.iter()
                .map(|s| (s.vdi.as_str(), s.ops()))
                .collect::<Vec<_>>(),
            [("a", 1), ("b", 0)]
        );
    }

    #[test]
    fn test_a_vdi_no_frontend_holds_is_kept_while_it_was_used_lately() {
        let t = VdiIoTable::default();
        t.vdi("gone").write(4096, 1e-4, true);
        // Its Arc was dropped at once, but it was used just now.
        assert_eq!(t.samples().len(), 1);
    }
}
