//! VDI write locks: taking and renewing one (fenced by a generation that grows at
//! every new holder), releasing it, asking its holder to hand it over, and marking
//! a generation's writes settled. Renewals confirmed by the leader without an
//! entry are in `lease.rs`, an operator's lock break in `lock_break.rs`.
use super::{
    invalid, no_vdi, ApplyResult, MetaState, Reply, VdiLock, MAX_CLOCK_SKEW_MS, MAX_LEASE_MS,
};
use drove_types::{ErrorKind, NodeId, VdiId};
use std::sync::Arc;

impl MetaState {
    /// [`super::Command::AcquireLock`]: the lease and the proposer's clock checked
    /// against the entry's time `now` (seconds), then [`MetaState::acquire_lock`].
    pub(super) fn apply_acquire_lock(
        &mut self,
        vdi: &str,
        node: NodeId,
        (now_ms, lease_ms, incarnation): (u64, u64, u64),
        now: u64,
    ) -> ApplyResult {
        if lease_ms == 0 || lease_ms > MAX_LEASE_MS {
            return Err(invalid(format!(
                "Bad lease {lease_ms} ms: use 1 to {MAX_LEASE_MS} ms"
            )));
        }
        if now_ms.abs_diff(now.saturating_mul(1000)) > MAX_CLOCK_SKEW_MS {
            return Err(invalid(format!(
                "Lock request stamped {now_ms} ms, {} ms away from the leader's clock: fix the clocks (NTP)",
                now_ms.abs_diff(now.saturating_mul(1000))
            )));
        }
        self.acquire_lock(vdi, node, incarnation, now_ms, lease_ms)
    }

    /// [`super::Command::MarkSettled`]: only the holder of that generation may.
    pub(super) fn mark_settled(
        &mut self,
        vdi: VdiId,
        node: NodeId,
        generation: u64,
    ) -> ApplyResult {
        match self.locks.get(&vdi) {
            Some(l) if l.owner == node && l.generation == generation => {}
            _ => {
                return Err((
                    ErrorKind::Fenced,
                    format!("Node {node} does not hold lock generation {generation} of VDI {vdi}"),
                ))
            }
        }
        let s = self.settled.entry(vdi).or_insert(0);
        *s = (*s).max(generation.saturating_sub(1));
        Ok(Reply::Done)
    }

    /// [`super::Command::ReleaseLock`].
    pub(super) fn release_lock(
        &mut self,
        vdi: &str,
        node: NodeId,
        generation: u64,
        now: u64,
    ) -> ApplyResult {
        let id = self.vdis.get(vdi).ok_or_else(|| no_vdi(vdi))?.id;
        if let Some(l) = self.locks.get(&id) {
            if l.owner == node && l.generation == generation {
                let to = l.handover_to;
                self.locks.remove(&id);
                // Handed to a node of another zone: the home follows it. The
                // holder drained its lag and flushed before releasing.
                if let Some(to) = to {
                    self.home_follows_handover(vdi, to, now);
                }
                // The holder flushed before releasing: its writes are settled,
                // if every earlier generation's were.
                let s = self.settled.entry(id).or_insert(0);
                if s.saturating_add(1) >= generation {
                    *s = (*s).max(generation);
                }
            }
        }
        Ok(Reply::Done)
    }

    /// [`super::Command::RequestHandover`].
    pub(super) fn request_handover(&mut self, vdi: &str, to: NodeId, now: u64) -> ApplyResult {
        let id = self.vdis.get(vdi).ok_or_else(|| no_vdi(vdi))?.id;
        if !self.map.nodes.contains_key(&to) {
            return Err((ErrorKind::NotFound, format!("No node {to} in the cluster")));
        }
        match self.locks.get_mut(&id) {
            Some(l) if l.owner != to => {
                l.handover_to = Some(to);
                Ok(Reply::Lock(l.clone()))
            }
            Some(l) => Ok(Reply::Lock(l.clone())),
            None => {
                // Nobody writes it (the last writer drained and released):
                // to a node of another zone, the home moves now.
                self.home_follows_handover(vdi, to, now);
                Ok(Reply::Done)
            }
        }
    }

    fn acquire_lock(
        &mut self,
        vdi: &str,
        node: NodeId,
        incarnation: u64,
        now_ms: u64,
        lease_ms: u64,
    ) -> ApplyResult {
        let id = self.vdis.get(vdi).ok_or_else(|| no_vdi(vdi))?.id;
        let expires_ms = now_ms.saturating_add(lease_ms);
        self.refuse_broken_holder(vdi, id, node, incarnation, now_ms)?;
        if let Some(l) = self.locks.get_mut(&id) {
            if l.owner == node && l.incarnation == incarnation {
                if l.handover_to.is_some() {
                    return Err((
                        ErrorKind::Locked,
                        format!(
                            "VDI '{vdi}' is being handed over; node {node} may not renew",
                            vdi = drove_types::shown(vdi)
                        ),
                    ));
                }
                l.expires_ms = l.expires_ms.max(expires_ms);
                l.lease_ms = l.lease_ms.max(lease_ms);
                l.home_zone = self.vdis.get(vdi).and_then(|v| v.home_zone.clone());
                return Ok(Reply::Lock(l.clone()));
            }
            if l.expires_ms > now_ms {
                let hint = match l.handover_to {
                    _ if l.owner == node => {
                        "it was taken by an earlier run of this node; its lease must end first"
                            .to_string()
                    }
                    Some(to) if to == node => "a hand-over to this node is under way".to_string(),
                    _ => format!("ask for a hand-over: drove vdi handover {vdi} --to {node}"),
                };
                return Err((
                    ErrorKind::Locked,
                    format!(
                        "VDI '{vdi}' is being written through node {} (lease for {} ms more); {hint}",
                        l.owner,
                        l.expires_ms - now_ms,
                        vdi = drove_types::shown(vdi)
                    ),
                ));
            }
        }
        let zone = self.map.node(node).map(|n| n.zone.as_str());
        if let Some(why) = self.vdis.get(vdi).and_then(|v| self.needs_promote(v, zone)) {
            return Err((ErrorKind::Locked, why));
        }
        let generation = self.lock_generations.get(&id).copied().unwrap_or(0) + 1;
        self.lock_generations.insert(id, generation);
        self.broken.remove(&id);
        // The first writer's zone becomes the home of a VDI created without one. Only
        // at the first lock: before it nothing was written, so no object moves.
        if generation == 1 {
            let zone = self.map.node(node).map(|n| n.zone.clone());
            if let Some(v) = Arc::make_mut(&mut self.vdis).get_mut(vdi) {
                if v.home_zone.is_none() && !v.snapshot {
                    v.home_zone = zone;
                }
            }
        }
        let lock = VdiLock {
            owner: node,
            generation,
            expires_ms,
            handover_to: None,
            vdi: id,
            incarnation,
            home_zone: self.vdis.get(vdi).and_then(|v| v.home_zone.clone()),
            lease_ms,
        };
        self.locks.insert(id, lock.clone());
        Ok(Reply::Lock(lock))
    }
}
