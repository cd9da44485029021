//! Cluster-wide settings ([`Settings`]) and the commands that change them
//! (`cluster set`): default copies, failure detection, the recovery rate, the
//! hold-down of silent nodes, `noout` and the backfill-full ratio.
use super::{check_copies, invalid, ApplyResult, MetaState, Reply, MAX_HOLD_DOWN_MS};
use serde::{Deserialize, Serialize};

/// Cluster-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Copies of a new VDI that does not ask for a number.
    pub default_copies: u8,
    /// Largest number of Raft voters; further nodes join as learners.
    pub max_voters: usize,
    /// A node whose heartbeats stop for this long is marked down (milliseconds).
    pub down_after_ms: u64,
    /// Recovery copies at most this many MiB per second per node (0: no limit).
    pub recovery_mib_s: u32,
    /// A node a gateway marked down because it went silent stays down at least this
    /// long (milliseconds), even if its heartbeats come back at once: a node that
    /// stalls now and then is not flipped down and up (an epoch and a recovery pass
    /// each time) more than once per hold.
    #[serde(default = "default_hold_down_ms")]
    pub hold_down_ms: u64,
    /// Maintenance flag (`drove cluster set noout on`, Ceph's `noout`): down nodes
    /// are not re-replicated. They are still marked down and left out of reads
    /// and writes; only recovery's background copying of what moved because a
    /// node is down waits. Writes still bring every copy they touch up to date.
    #[serde(default)]
    pub noout: bool,
    /// Recovery stops copying onto a node whose disk is this full or fuller (percent
    /// of its size in use; Ceph's backfillfull ratio): copies that are there only to
    /// restore redundancy must not take the space its clients' writes need. 100:
    /// never held back.
    #[serde(default = "default_backfill_full_pct")]
    pub backfill_full_pct: u8,
    /// The I/O limits a new VDI starts with (its own flags change them; `drove
    /// cluster set --default-iops-limit`). Unlimited by default.
    #[serde(default, skip_serializing_if = "drove_types::Qos::is_unlimited")]
    pub default_qos: drove_types::Qos,
    /// The cluster's feature level (see `drove_types::FEATURE_LEVEL`): commands of a
    /// higher level are refused. A cluster begins at its first node's level (a state
    /// from before levels reads as 1) and rises with [`super::Command::FinishUpgrade`].
    #[serde(default = "base_feature_level")]
    pub feature_level: u32,
}

fn base_feature_level() -> u32 {
    drove_types::BASE_FEATURE_LEVEL
}

/// Default of [`Settings::backfill_full_pct`]: 90 %, between the 85 % at which
/// `cluster health` warns of a disk near full and the 95 % at which it is an error.
pub const DEFAULT_BACKFILL_FULL_PCT: u8 = 90;

fn default_backfill_full_pct() -> u8 {
    DEFAULT_BACKFILL_FULL_PCT
}

/// Default of [`Settings::hold_down_ms`]: one minute.
pub const DEFAULT_HOLD_DOWN_MS: u64 = 60_000;

fn default_hold_down_ms() -> u64 {
    DEFAULT_HOLD_DOWN_MS
}

/// Default of [`Settings::down_after_ms`]: 5 s.
pub const DEFAULT_DOWN_AFTER_MS: u64 = 5000;

/// Default of [`Settings::recovery_mib_s`].
pub const DEFAULT_RECOVERY_MIB_S: u32 = 200;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_copies: 3,
            max_voters: 3,
            down_after_ms: DEFAULT_DOWN_AFTER_MS,
            recovery_mib_s: DEFAULT_RECOVERY_MIB_S,
            hold_down_ms: DEFAULT_HOLD_DOWN_MS,
            noout: false,
            backfill_full_pct: DEFAULT_BACKFILL_FULL_PCT,
            default_qos: drove_types::Qos::default(),
            feature_level: drove_types::BASE_FEATURE_LEVEL,
        }
    }
}

impl MetaState {
    /// [`super::Command::SetDefaultCopies`].
    pub(super) fn set_default_copies(&mut self, copies: u8) -> ApplyResult {
        check_copies(copies)?;
        self.settings.default_copies = copies;
        Ok(Reply::Done)
    }

    /// [`super::Command::SetHealthSettings`]: what is given, all or nothing.
    pub(super) fn set_health_settings(
        &mut self,
        down_after_ms: Option<u64>,
        recovery_mib_s: Option<u32>,
        hold_down_ms: Option<u64>,
    ) -> ApplyResult {
        if let Some(h) = hold_down_ms {
            if h > MAX_HOLD_DOWN_MS {
                return Err(invalid(format!(
                    "Bad hold-down {h} ms: at most {MAX_HOLD_DOWN_MS} ms (a day)"
                )));
            }
        }
        if let Some(ms) = down_after_ms {
            if ms < 500 {
                return Err(invalid(format!(
                    "Bad down-after {ms} ms: use at least 500 ms"
                )));
            }
            self.settings.down_after_ms = ms;
        }
        if let Some(r) = recovery_mib_s {
            self.settings.recovery_mib_s = r;
        }
        if let Some(h) = hold_down_ms {
            self.settings.hold_down_ms = h;
        }
        Ok(Reply::Done)
    }

    /// [`super::Command::SetNoout`].
    pub(super) fn set_noout(&mut self, on: bool) -> ApplyResult {
        self.settings.noout = on;
        Ok(Reply::Done)
    }

    /// [`super::Command::SetDefaultQos`].
    pub(super) fn set_default_qos(&mut self, change: &drove_types::Qos) -> ApplyResult {
        change
            .validate(true)
            .map_err(|e| invalid(e.message().to_string()))?;
        self.settings.default_qos = self.settings.default_qos.merged(change);
        Ok(Reply::Done)
    }

    /// [`super::Command::SetBackfillFull`].
    pub(super) fn set_backfill_full(&mut self, pct: u8) -> ApplyResult {
        if !(1..=100).contains(&pct) {
            return Err(invalid(format!(
                "Bad backfill-full {pct} %: use 1 to 100 (percent of a disk in use)"
            )));
        }
        self.settings.backfill_full_pct = pct;
        Ok(Reply::Done)
    }
}
