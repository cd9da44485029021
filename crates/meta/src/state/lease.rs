//! Lease renewals in the lock table. The leader confirms a holder's renewal without
//! a log entry of its own (see [`crate::lease`]); what it confirmed reaches the table
//! through [`super::Command::ExtendLeases`], proposed ahead of any command beside it, and a
//! new leader's first command ([`MetaState::new_term`]) covers what its predecessor
//! confirmed and never wrote down.
use drove_types::{NodeId, VdiId};
use serde::{Deserialize, Serialize};

use super::{invalid, ApplyResult, MetaState, Reply, VdiLock, MAX_CLOCK_SKEW_MS, MAX_LEASE_MS};

/// Most renewals in one [`super::Command::ExtendLeases`].
pub const MAX_EXTENSIONS: usize = 65_536;
/// What a new leader adds to every lease beyond its length: the entry's time has a
/// resolution of a second, and clocks run at slightly different rates.
pub const NEW_LEADER_MARGIN_MS: u64 = 2_000;
/// The lease assumed for a lock granted before leases were recorded in it.
pub const UNRECORDED_LEASE_MS: u64 = 15_000;

/// One confirmed renewal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseExtension {
    /// The lock's key in the table.
    pub vdi: VdiId,
    /// The holder that renewed.
    pub owner: NodeId,
    /// Its run.
    pub incarnation: u64,
    /// The generation it holds.
    pub generation: u64,
    /// The lease now ends no earlier than this (holder's clock, ms since the epoch).
    pub until_ms: u64,
}

/// The lease a lock's holder asked for.
pub fn lease_of(lock: &VdiLock) -> u64 {
    if lock.lease_ms == 0 {
        UNRECORDED_LEASE_MS
    } else {
        lock.lease_ms
    }
}

impl MetaState {
    pub(super) fn extend_leases(&mut self, leases: &[LeaseExtension], now: u64) -> ApplyResult {
        if leases.len() > MAX_EXTENSIONS {
            return Err(invalid(format!(
                "{} lease renewals in one command; at most {MAX_EXTENSIONS}",
                leases.len()
            )));
        }
        // No renewal reaches further than the longest lease from the entry's time.
        let limit = now
            .saturating_mul(1000)
            .saturating_add(MAX_LEASE_MS + MAX_CLOCK_SKEW_MS);
        if let Some(e) = leases.iter().find(|e| e.until_ms > limit) {
            return Err(invalid(format!(
                "Lease renewal of VDI {} to {} ms is beyond the longest lease",
                e.vdi, e.until_ms
            )));
        }
        for e in leases {
            if let Some(l) = self.locks.get_mut(&e.vdi) {
                // A renewal of a lock that changed hands since (released, taken by
                // another run, broken) extends nothing.
                if l.owner == e.owner
                    && l.incarnation == e.incarnation
                    && l.generation == e.generation
                    && l.handover_to.is_none()
                {
                    l.expires_ms = l.expires_ms.max(e.until_ms);
                }
            }
        }
        Ok(Reply::Done)
    }

    /// [`super::Command::ForgetRun`]: the leases of the locks an earlier run of
    /// `node` holds end now (their generations stay unsettled).
    pub(super) fn forget_run(&mut self, node: NodeId, incarnation: u64) -> ApplyResult {
        if !self.map.nodes.contains_key(&node) {
            return Err((
                drove_types::ErrorKind::NotFound,
                format!("No node {node} in the cluster"),
            ));
        }
        for l in self.locks.values_mut() {
            if l.owner == node && l.incarnation != incarnation {
                l.expires_ms = 0;
            }
        }
        Ok(Reply::Done)
    }

    /// Called before the first command of each Raft term is applied, with that
    /// command's time: a new leader does not know the renewals its predecessor
    /// confirmed without writing them down, so every lock lasts at least its lease
    /// plus `NEW_LEADER_MARGIN_MS` from now. Deterministic: the term and the time
    /// come from the log.
    pub fn new_term(&mut self, term: u64, now_ms: u64) {
        if term <= self.lease_term {
            return;
        }
        self.lease_term = term;
        for l in self.locks.values_mut() {
            let until = now_ms
                .saturating_add(lease_of(l))
                .saturating_add(NEW_LEADER_MARGIN_MS);
            l.expires_ms = l.expires_ms.max(until);
        }
    }
}
