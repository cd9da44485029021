//! The cluster metadata itself: the cluster map with its epoch history, the VDI table
//! and the settings, and the commands that change them. This is the replicated state
//! machine's pure core: [`MetaState::apply`] is a plain match with no I/O, so every
//! node that applies the same committed log reaches the same state. Nothing here is on
//! the data path; gateways work from copies of the map and VDI records they hold.
//!
//! This file holds the state's types and [`MetaState::apply`], which hands each
//! [`Command`] (`command.rs`, the Raft log's format) to the handler of its area:
//! membership and epochs (`membership.rs`), the VDI table (`vdis.rs`, `delete.rs`,
//! `lineage.rs`, `home.rs`, `policy.rs`), write locks and leases (`locks.rs`,
//! `lease.rs`, `lock_break.rs`), settings (`settings.rs`) and tokens (`tokens.rs`).
use drove_types::{ClusterMap, Epoch, ErrorKind, NodeId, VdiId, VdiInfo};
// The tests beside the handlers take these through `use super::*`.
#[cfg(test)]
use drove_types::{NodeInfo, NodeState, ReplicationMode, WritePolicy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Largest VDI: 1 PiB.
pub const MAX_VDI_SIZE: u64 = 1 << 50;

/// VDI sizes are whole 512-byte sectors.
pub const SECTOR_SIZE: u64 = 512;

/// Largest object size a VDI may ask for: 1 GiB.
pub const MAX_OBJECT_SIZE: u32 = 1 << 30;

/// Longest lock lease: a lock taken for longer could outlive its holder for good
/// (an endless lease once locked a VDI across restarts).
pub const MAX_LEASE_MS: u64 = 10 * 60 * 1000;

/// How far a lock request's clock may be from the time in its log entry.
pub const MAX_CLOCK_SKEW_MS: u64 = 5 * 60 * 1000;

/// Longest hold-down of a node marked down.
pub const MAX_HOLD_DOWN_MS: u64 = 24 * 3600 * 1000;

/// Largest placement weight of a node.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// Most verdicts one [`Command::JudgeNodes`] may carry.
pub const MAX_VERDICTS: usize = 4096;

/// One change of the cluster map, kept forever so recovery can reason about old epochs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The epoch the change produced.
    pub epoch: Epoch,
    /// When the change was proposed, seconds since the Unix epoch.
    pub at_unix: u64,
    /// What changed, for humans.
    pub change: String,
    /// The map as it was at this epoch: recovery works out from it which objects a
    /// node held at every epoch, including epochs it did not see go by.
    pub map: ClusterMap,
}

/// An epoch change as `drove cluster status` shows it: when and what, without
/// the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochNote {
    /// The epoch the change produced.
    pub epoch: Epoch,
    /// When the change was proposed, seconds since the Unix epoch.
    pub at_unix: u64,
    /// What changed, for humans.
    pub change: String,
}

impl From<&EpochRecord> for EpochNote {
    fn from(r: &EpochRecord) -> Self {
        EpochNote {
            epoch: r.epoch,
            at_unix: r.at_unix,
            change: r.change.clone(),
        }
    }
}

/// Epoch changes trimmed from the history whose notes are kept for `drove cluster
/// status` (the oldest go first).
pub const MAX_TRIMMED_NOTES: usize = 1024;

/// Which stretch of epochs an epoch history holds: its first and last epochs.
/// The history is contiguous (one record per epoch, trimmed only from the front),
/// so two histories with the same span hold the same records. Its length alone
/// does not say that: trimmed and grown again, a history has its old length and
/// other maps.
pub fn history_span(history: &[EpochRecord]) -> Option<(Epoch, Epoch)> {
    Some((history.first()?.epoch, history.last()?.epoch))
}

/// The write lock of a VDI: a lease held by the gateway node that writes it.
/// Replicas refuse writes that carry an older `generation` (fencing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiLock {
    /// The gateway node holding the lock.
    pub owner: NodeId,
    /// Grows by one at every new holder; never reused for a VDI.
    pub generation: u64,
    /// The lease ends at this time (milliseconds since the Unix epoch, holder's clock).
    pub expires_ms: u64,
    /// A node that asked the holder to hand the lock over.
    pub handover_to: Option<NodeId>,
    /// The VDI id the lock covers: a snapshot gives the VDI's name a new id and moves
    /// the lock to it, and a gateway that learns the new id from the lock writes there.
    #[serde(default)]
    pub vdi: VdiId,
    /// Which run of the owner's process holds it (random per start): a node that
    /// restarted is not the holder that may have died mid-write, so it cannot renew
    /// the old lease and gets a new generation once it ends.
    #[serde(default)]
    pub incarnation: u64,
    /// The VDI's home zone as of this grant or renewal: the gateway writes only once
    /// its record of the VDI shows it (placement depends on it).
    #[serde(default)]
    pub home_zone: Option<String>,
    /// The lease length the holder asked for (0 in locks granted before it was
    /// recorded). Renewals through the leader are never longer, and a new leader
    /// keeps every lock alive this long (see [`MetaState::new_term`]).
    #[serde(default)]
    pub lease_ms: u64,
}

/// Everything the metadata holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    /// The cluster map; its epoch grows by one at every node add, remove or state change.
    pub map: ClusterMap,
    /// Every epoch change, oldest first, back to the last epoch at which every
    /// node was up and clean ([`Command::TrimHistory`]). Shared between states
    /// (an `Arc`): the state machine copies its state at every applied batch of
    /// entries that readers still hold, and this list only changes at an epoch.
    pub epoch_history: Arc<Vec<EpochRecord>>,
    /// What the last changes trimmed from the history were, oldest first, without
    /// their maps (at most [`MAX_TRIMMED_NOTES`]): `drove cluster status` tells the
    /// story of a failure after the cluster is clean again.
    #[serde(default)]
    pub trimmed_notes: Arc<Vec<EpochNote>>,
    /// The VDI table, by name. Shared between states as the history is: a command
    /// that changes no VDI (a lock, a node verdict) copies none.
    pub vdis: Arc<BTreeMap<String, VdiInfo>>,
    /// The id the next VDI gets; ids are never reused.
    pub next_vdi_id: u32,
    /// The id the next joining node gets (the bootstrap node is 1).
    pub next_node_id: u64,
    /// Cluster-wide settings.
    pub settings: Settings,
    /// Write locks, by VDI id.
    pub locks: BTreeMap<VdiId, VdiLock>,
    /// The newest Raft term whose leader's first command has been applied: at that
    /// command every lock was extended (see [`MetaState::new_term`]).
    #[serde(default)]
    pub lease_term: u64,
    /// The last lock generation handed out for each VDI (kept after release).
    pub lock_generations: BTreeMap<VdiId, u64>,
    /// Per VDI, the newest lock generation whose writes are known identical on every
    /// replica: released cleanly after a flush, or repaired by the next holder after
    /// a crash. A holder of generation G whose predecessors are not all settled
    /// (settled < G - 1) must make the replicas identical before serving the VDI.
    #[serde(default)]
    pub settled: BTreeMap<VdiId, u64>,
    /// Nodes removed from the cluster: their ids never come back (a removed node
    /// that restarts must not rejoin with its stale data; it learns it was removed
    /// and stops).
    #[serde(default)]
    pub removed: std::collections::BTreeSet<NodeId>,
    /// Nodes marked down that must stay down until this time (ms since the Unix
    /// epoch; see [`Settings::hold_down_ms`]).
    #[serde(default)]
    pub held_down: BTreeMap<NodeId, u64>,
    /// Locks an operator broke (`drove vdi lock break`), by VDI id: their holder may
    /// not take the lock again while its old lease would have run.
    #[serde(default)]
    pub broken: BTreeMap<VdiId, BrokenLock>,
    /// Admin API tokens by name (`drove token create`): role and secret hash.
    #[serde(default)]
    pub tokens: BTreeMap<String, ApiToken>,
}

/// A write lock an operator broke: the holder it was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenLock {
    /// The node that held it.
    pub owner: NodeId,
    /// The run of that node's process that held it.
    pub incarnation: u64,
    /// When its lease would have ended (ms since the Unix epoch, holder's clock).
    pub until_ms: u64,
}

impl Default for MetaState {
    fn default() -> Self {
        MetaState {
            map: ClusterMap::default(),
            epoch_history: Arc::default(),
            trimmed_notes: Arc::default(),
            vdis: Arc::default(),
            next_vdi_id: 1,
            next_node_id: 2,
            settings: Settings::default(),
            locks: BTreeMap::new(),
            lease_term: 0,
            lock_generations: BTreeMap::new(),
            settled: BTreeMap::new(),
            removed: std::collections::BTreeSet::new(),
            held_down: BTreeMap::new(),
            broken: BTreeMap::new(),
            tokens: BTreeMap::new(),
        }
    }
}

pub(crate) fn invalid(msg: String) -> (ErrorKind, String) {
    (ErrorKind::Invalid, msg)
}

pub(crate) fn no_vdi(name: &str) -> (ErrorKind, String) {
    (
        ErrorKind::NotFound,
        format!("No VDI named '{name}'", name = drove_types::shown(name)),
    )
}

impl MetaState {
    /// Apply one command at time `now` (seconds since the Unix epoch, decided by the
    /// proposer and carried in the log so every node records the same value).
    /// Deterministic: the result depends only on the state, the command and `now`. On
    /// error the state is unchanged. Each command goes to the handler of its area.
    pub fn apply(&mut self, cmd: &Command, now: u64) -> ApplyResult {
        self.check_feature_level(cmd)?;
        match cmd {
            // Batches are taken apart by the state machine before they get here.
            Command::Batch(_) => Err(invalid("A batch of commands may not hold a batch".into())),
            // Membership and epochs (membership.rs).
            Command::AllocateNodeId => self.allocate_node_id(),
            Command::UpsertNode(node) => self.apply_upsert_node(node, now),
            Command::SetNodeState {
                id,
                state,
                reason,
                hold_ms,
                judged,
            } => {
                self.check_judge(*id, judged.as_ref())?;
                self.apply_set_node_state(*id, *state, reason, *hold_ms, now)
            }
            Command::JudgeNodeState { id, state, .. } => self.judge_node_state(*id, *state, now),
            Command::JudgeNodes { verdicts, .. } => self.judge_nodes(verdicts, now),
            Command::RemoveNode { id } => self.remove_node(*id, now),
            Command::FinishUpgrade { level } => self.finish_upgrade(*level),
            Command::TrimHistory { keep_from } => self.trim_history(*keep_from),
            // The VDI table (vdis.rs, delete.rs, lineage.rs, home.rs, policy.rs).
            Command::CreateVdi {
                name,
                size,
                copies,
                mode,
                object_size,
                now: created,
                home_zone,
                home_copies,
                policy,
                max_lag_ms,
                max_lag_bytes,
                qos,
            } => {
                let home = (home_zone.clone(), *home_copies);
                let lag = (*policy, *max_lag_ms, *max_lag_bytes);
                let shape = (*size, *object_size, *copies, *mode);
                self.create_vdi(name, shape, *created, home, lag, qos)
            }
            Command::DeleteVdi { name, force } => self.delete_vdi(name, *force, now),
            Command::ResizeVdi { name, size } => self.resize_vdi(name, *size),
            Command::GrowVdi { name, by } => self.grow_vdi(name, *by),
            Command::RenameVdi { name, to } => self.rename_vdi(name, to, now),
            Command::SetMinCopies { name, min_copies } => self.set_min_copies(name, *min_copies),
            Command::SnapshotVdi {
                name,
                snap,
                by,
                now_ms,
            } => self.snapshot_vdi(name, snap, *by, *now_ms, now),
            Command::CloneVdi {
                snap,
                name,
                ephemeral,
            } => self.clone_vdi(snap, name, *ephemeral, now),
            Command::CloneMany {
                snap,
                names,
                ephemeral,
            } => self.clone_many(snap, names, *ephemeral, now),
            Command::RollbackVdi { name, snap, now_ms } => self.rollback_vdi(name, snap, *now_ms),
            Command::Flattened { name, id } => self.flattened(name, *id),
            Command::DeleteEphemeral { name, id } => self.delete_ephemeral(name, *id),
            Command::PromoteVdi { name, zone } => self.promote_vdi(name, zone, now),
            Command::SetVdiPolicy {
                name,
                policy,
                max_lag_ms,
                max_lag_bytes,
                reset_max_lag_ms,
                reset_max_lag_bytes,
            } => self.set_vdi_policy(
                name,
                *policy,
                (*max_lag_ms, *reset_max_lag_ms),
                (*max_lag_bytes, *reset_max_lag_bytes),
            ),
            Command::SetVdiAccess { name, nbd_clients } => self.set_vdi_access(name, nbd_clients),
            Command::SetVdiQos { name, qos } => self.set_vdi_qos(name, qos),
            Command::SetDefaultQos(qos) => self.set_default_qos(qos),
            // Write locks and leases (locks.rs, lease.rs, lock_break.rs).
            Command::AcquireLock {
                vdi,
                node,
                now_ms,
                lease_ms,
                incarnation,
            } => self.apply_acquire_lock(vdi, *node, (*now_ms, *lease_ms, *incarnation), now),
            Command::ExtendLeases { leases } => self.extend_leases(leases, now),
            Command::MarkSettled {
                vdi,
                node,
                generation,
            } => self.mark_settled(*vdi, *node, *generation),
            Command::ReleaseLock {
                vdi,
                node,
                generation,
            } => self.release_lock(vdi, *node, *generation, now),
            Command::RequestHandover { vdi, to } => self.request_handover(vdi, *to, now),
            Command::BreakLock { vdi } => self.break_lock(vdi),
            Command::ForgetRun { node, incarnation } => self.forget_run(*node, *incarnation),
            // Settings (settings.rs).
            Command::SetDefaultCopies(copies) => self.set_default_copies(*copies),
            Command::SetHealthSettings {
                down_after_ms,
                recovery_mib_s,
                hold_down_ms,
            } => self.set_health_settings(*down_after_ms, *recovery_mib_s, *hold_down_ms),
            Command::SetNoout(on) => self.set_noout(*on),
            Command::SetBackfillFull(pct) => self.set_backfill_full(*pct),
            // Admin API tokens (tokens.rs).
            Command::AddToken { name, role, sha256 } => {
                self.add_token(name, *role, sha256, now.saturating_mul(1000))
            }
            Command::RemoveToken { name } => self.remove_token(name),
        }
    }
}

mod command;
mod delete;
mod home;
pub(crate) mod lease;
mod lineage;
mod lock_break;
mod locks;
mod membership;
mod policy;
mod settings;
pub mod tokens;
mod vdis;

pub use command::{ApplyResult, Command, Judged, Reply};
pub(crate) use membership::too_old;
pub use settings::{Settings, DEFAULT_DOWN_AFTER_MS, DEFAULT_RECOVERY_MIB_S};
pub use tokens::{ApiToken, Role};
use vdis::check_copies;

#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "state/lock_tests.rs"]
pub(crate) mod lock_tests;

#[cfg(test)]
#[path = "state/lineage_tests.rs"]
mod lineage_tests;

#[cfg(test)]
#[path = "state/policy_tests.rs"]
mod policy_tests;

#[cfg(test)]
#[path = "state/home_tests.rs"]
mod home_tests;

#[cfg(test)]
#[path = "state/lease_tests.rs"]
mod lease_tests;

#[cfg(test)]
#[path = "state/token_tests.rs"]
mod token_tests;

#[cfg(test)]
#[path = "state/command_tests.rs"]
mod command_tests;

#[cfg(test)]
#[path = "state/state_golden_tests.rs"]
mod state_golden_tests;
