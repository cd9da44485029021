//! Moving a VDI's home zone: a hand-over to a node of another zone (a VM
//! live-migrating between datacenters) and `drove vdi promote` after the home zone
//! was lost.
//!
//! Objects are placed by the home zone, so a move changes where every object of the
//! VDI lives. It happens at a new map epoch (the map itself unchanged) and the old
//! home is kept in [`VdiInfo::past_homes`] with that epoch: placement on the map of
//! an earlier epoch uses the home of that time ([`VdiInfo::home_at`]). Recovery then
//! sees the move as it sees a node join: the new holders gained copies, recover them
//! from the old ones at the recovery rate (a write to such a copy recovers it
//! first), and the old holders drop theirs once the new ones are current.
//!
//! A hand-over moves the home when the holder releases the lock to a node of another
//! zone: the holder drained its zone-sync lag and flushed before releasing, so every
//! copy has every acknowledged write at that moment. A promotion moves it while no
//! node of the old home is up; with `zone-sync` the copies elsewhere may miss what
//! was inside the lag when the home was lost, which `drove vdi promote` states first.
use drove_types::{ErrorKind, NodeState, PastHome, VdiInfo, WritePolicy, MAX_PAST_HOMES};

use std::sync::Arc;

use super::{invalid, no_vdi, ApplyResult, Epoch, MetaState, Reply};

impl MetaState {
    /// Whether `zone` has a node that may hold data (up, weight above zero).
    pub(super) fn zone_up(&self, zone: &str) -> bool {
        self.map
            .nodes
            .values()
            .any(|n| n.zone == zone && n.state == NodeState::Up && n.weight > 0)
    }

    /// Give VDI `name` the home zone `zone` at a new epoch, keeping the old one.
    pub(super) fn move_home(&mut self, name: &str, zone: &str, now: u64, why: &str) {
        let next = Epoch(self.map.epoch.0 + 1);
        let Some(v) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
            return;
        };
        let old = v.home_zone.replace(zone.to_string());
        v.past_homes.push(PastHome {
            zone: old.clone(),
            until: next,
        });
        if v.past_homes.len() > MAX_PAST_HOMES {
            let extra = v.past_homes.len() - MAX_PAST_HOMES;
            v.past_homes.drain(..extra);
        }
        let id = v.id;
        if let Some(l) = self.locks.get_mut(&id) {
            l.home_zone = Some(zone.to_string());
        }
        let old = old.as_deref().unwrap_or("none");
        self.bump_epoch(
            now,
            format!("VDI '{name}' home zone {old} -> {zone} ({why})"),
        );
    }

    /// The lock of `name` held by `node` is being released after it was asked to hand
    /// it to a node of another zone: move the home there.
    pub(super) fn home_follows_handover(&mut self, name: &str, to: drove_types::NodeId, now: u64) {
        let Some(zone) = self.map.node(to).map(|n| n.zone.clone()) else {
            return;
        };
        let Some(v) = self.vdis.get(name) else {
            return;
        };
        if v.snapshot || v.home_zone.is_none() || v.home_zone.as_deref() == Some(zone.as_str()) {
            return;
        }
        self.move_home(name, &zone, now, &format!("handed over to node {to}"));
    }

    /// Whether a node of `node_zone` must be refused `v`'s write lock because `v` is
    /// zone-sync and no node of its home zone is up: the copies elsewhere may miss
    /// the writes that were inside the lag, and only `drove vdi promote` accepts that.
    pub(super) fn needs_promote(&self, v: &VdiInfo, node_zone: Option<&str>) -> Option<String> {
        let home = v.home_zone.as_deref()?;
        if v.policy != WritePolicy::ZoneSync || node_zone == Some(home) || self.zone_up(home) {
            return None;
        }
        Some(format!(
            "VDI '{}' is zone-sync and no node of its home zone {home} is up: the copies in \
             other zones may miss the writes acknowledged in the last {} ms before it was \
             lost. Accept that and write from another zone with: drove vdi promote {} --zone ZONE",
            v.name,
            v.max_lag().0.as_millis(),
            v.name
        ))
    }

    /// `drove vdi promote`: make `zone` the home of VDI `name`, whose home zone has no
    /// node up.
    pub(super) fn promote_vdi(&mut self, name: &str, zone: &str, now: u64) -> ApplyResult {
        let v = self.vdis.get(name).ok_or_else(|| no_vdi(name))?;
        if v.snapshot {
            return Err(invalid(format!(
                "'{name}' is a snapshot: it is read-only and has nothing to promote",
                name = drove_types::shown(name)
            )));
        }
        let Some(home) = v.home_zone.clone() else {
            return Err(invalid(format!(
                "VDI '{name}' has no home zone yet: its first writer's zone becomes it",
                name = drove_types::shown(name)
            )));
        };
        if home == zone {
            return Err(invalid(format!(
                "Zone {zone} is already the home zone of VDI '{name}'",
                name = drove_types::shown(name)
            )));
        }
        if !self.map.nodes.values().any(|n| n.zone == zone) {
            return Err((
                ErrorKind::NotFound,
                format!("No node of the cluster is in zone {zone}"),
            ));
        }
        if !self.zone_up(zone) {
            return Err((
                ErrorKind::Unavailable,
                format!("No node of zone {zone} is up: promote to a zone that can hold copies"),
            ));
        }
        if self.zone_up(&home) {
            return Err((
                ErrorKind::Locked,
                format!(
                    "The home zone {home} of VDI '{name}' still has nodes up: move the VDI with \
                     drove vdi handover (it loses nothing) instead of promote",
                    name = drove_types::shown(name)
                ),
            ));
        }
        self.move_home(name, zone, now, "promoted after its home zone was lost");
        Ok(Reply::Vdi(self.vdis[name].clone()))
    }
}
