//! A deterministic simulation of a drove cluster that runs drove's own code.
//!
//! ```text
//! clients ──> Gateway ──(Transport = SimTransport)──> apply_and_forward ──> LocalStore ──> MemStore
//!   (VMs)      (real)         simulated network            (real)             (real)      (memory)
//!                 └── Membership / locks ──> MetaState::apply (the real state machine)
//! ```
//! Everything runs on one thread, on tokio's paused clock: time moves only when
//! every task waits, straight to the next timer, so a minute of a cluster's life
//! takes the CPU time of its work, and the order of events depends on nothing but
//! the seed. The seams that make drove's code run here are
//! [`drove_replica::Transport`] (the network), tokio's clock (every timer and
//! instant of the replication code), [`drove_objstore::ObjectStore::never_blocks`]
//! (a memory store runs on the calling task, not on the blocking pool) and ordered
//! iteration where the order decides what happens (recovery's work list, the
//! zone-sync lanes).
//!
//! - [`faults`]: seeded fault runs and the invariants checked after each
//!   (`drove sim faults`).
//! - [`paper`]: the paper's four operations at its scale, with its indexes
//!   (`drove sim paper`).
//! - [`dcloss`]: the time to recover from the loss of a datacenter
//!   (`drove sim dc-loss`).
#![deny(missing_docs)]

pub mod cluster;
pub mod dcloss;
pub mod disk;
pub mod faults;
pub mod metanet;
pub mod model;
pub mod net;
pub mod paper;
pub mod rng;
pub mod sizestore;
pub mod testing;

pub use faults::{run_seed, run_seed_within, FaultOpts, SeedReport, SEED_LIMIT};
pub use model::Model;

thread_local! {
    /// When this thread's simulated runtime started.
    static STARTED: std::cell::Cell<Option<tokio::time::Instant>> = const { std::cell::Cell::new(None) };
}

#[cfg(not(tokio_unstable))]
compile_error!(
    "drove-sim needs tokio built with --cfg tokio_unstable (set in .cargo/config.toml; \
     a RUSTFLAGS variable replaces it: add --cfg tokio_unstable to it)"
);

/// A runtime for one simulation: one thread, tokio's clock paused; [`sim_time`]
/// counts from its start.
///
/// tokio's own random choices are seeded, so they are the same in every run: a
/// `watch` receiver waits on one of 8 queues picked at random, so the tasks one
/// send wakes run in an order that would otherwise differ from run to run (and
/// so would `tokio::select!` without `biased`).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .rng_seed(tokio::runtime::RngSeed::from_bytes(b"drove-sim"))
        .build()?;
    STARTED.with(|s| s.set(Some(rt.block_on(async { tokio::time::Instant::now() }))));
    Ok(rt)
}

/// The simulated time since this thread's last [`runtime`] started (for log
/// lines); `None` outside a simulation.
pub fn sim_time() -> Option<std::time::Duration> {
    let start = STARTED.with(|s| s.get())?;
    tokio::runtime::Handle::try_current().ok()?;
    Some(tokio::time::Instant::now().saturating_duration_since(start))
}

/// `t` as simulated time since this thread's last [`runtime`] started.
pub fn sim_offset(t: tokio::time::Instant) -> std::time::Duration {
    STARTED
        .with(|s| s.get())
        .map_or(std::time::Duration::ZERO, |s| {
            t.saturating_duration_since(s)
        })
}

/// Run seeds `first..first + count` on `threads` threads (each seed on its own
/// simulated runtime); the reports in seed order.
pub fn run_seeds(
    first: u64,
    count: u64,
    opts: &FaultOpts,
    threads: usize,
    progress: &(dyn Fn(&SeedReport) + Sync),
) -> anyhow::Result<Vec<SeedReport>> {
    let next = std::sync::atomic::AtomicU64::new(0);
    let out = parking_lot::Mutex::new(Vec::new());
    let err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count || err.lock().is_some() {
                    return;
                }
                match run_seed(first.wrapping_add(i), opts) {
                    Ok(r) => {
                        progress(&r);
                        out.lock().push(r);
                    }
                    Err(e) => *err.lock() = Some(e),
                }
            });
        }
    });
    if let Some(e) = err.into_inner() {
        return Err(e);
    }
    let mut v = out.into_inner();
    v.sort_by_key(|r| r.seed);
    Ok(v)
}
