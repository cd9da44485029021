//! How far a node's recovery is: the pass under way ([`Pass`], the engine's
//! record) and what `drove cluster status` shows of it ([`Progress`]).
use drove_types::Epoch;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Recovery progress of one node, for `drove cluster status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The epoch being recovered to.
    pub epoch: u64,
    /// Objects this node had to recover at this epoch.
    pub total: u64,
    /// Objects made current so far.
    pub done: u64,
    /// Objects whose copy failed (retried).
    pub failed: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds since the pass started.
    pub elapsed_s: f64,
    /// Bytes copied per second over the pass.
    pub rate_bytes_s: f64,
    /// Seconds left at that rate (None when unknown).
    pub eta_s: Option<f64>,
    /// The node is fully current at `epoch`.
    pub clean: bool,
    /// The configured rate limit, MiB/s (0: none).
    pub limit_mib_s: u32,
    /// Objects whose copy waits for `noout` to be cleared: they are here only
    /// because a node is down.
    #[serde(default)]
    pub waiting_noout: u64,
    /// Objects whose copy waits for room: this node's disk is fuller than the
    /// cluster's backfill-full setting.
    #[serde(default)]
    pub waiting_full: u64,
    /// Percent of this node's disk in use, when recovery last looked (None: not
    /// known).
    #[serde(default)]
    pub disk_used_pct: Option<f64>,
}

pub(super) struct Pass {
    pub(super) epoch: Epoch,
    pub(super) total: u64,
    pub(super) done: u64,
    pub(super) failed: u64,
    pub(super) bytes: u64,
    pub(super) started: Instant,
    pub(super) finished: Option<Instant>,
    pub(super) clean: bool,
    /// Pending objects left alone under `noout` in the last round.
    pub(super) waiting: u64,
    /// Pending objects left alone in the last round because the disk is too full.
    pub(super) waiting_full: u64,
    /// Percent of the disk in use at the last look.
    pub(super) disk_used_pct: Option<f64>,
}

impl Pass {
    /// A pass of `total` objects starting now.
    pub(super) fn new(epoch: Epoch, total: u64) -> Pass {
        Pass {
            epoch,
            total,
            done: 0,
            failed: 0,
            bytes: 0,
            started: Instant::now(),
            finished: None,
            clean: false,
            waiting: 0,
            waiting_full: 0,
            disk_used_pct: None,
        }
    }
}
