//! The fault injector: which fault comes next, on which node or zone, for how
//! long, and what it did (crashes, cuts, zone losses, power losses, flipped and
//! failed disks).
use drove_types::NodeId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::*;
use crate::cluster::SimCluster;
use crate::model::Model;
use crate::rng::Rng;

/// How many disks a run may replace (each loses every copy it held for good):
/// copies - 1, the most the redundancy covers.
pub(super) const REPLACED_MAX: usize = 2;

/// Chance that a power loss comes while another fault is under way (when power
/// losses are among the run's kinds).
pub(super) const POWER_DURING: f64 = 0.3;

/// What injects a run's faults, and what it has done.
pub(super) struct Injector<'a> {
    c: &'a Arc<SimCluster>,
    hits: &'a Mutex<Vec<Hit>>,
    losses: &'a Mutex<Vec<Loss>>,
    start: Instant,
    /// What it did, one line per fault.
    pub(super) out: Vec<String>,
    /// Disks replaced so far.
    replaced: usize,
    /// Whether power losses are among the kinds (they also come during others).
    power: bool,
}

impl<'a> Injector<'a> {
    pub(super) fn new(
        c: &'a Arc<SimCluster>,
        hits: &'a Mutex<Vec<Hit>>,
        losses: &'a Mutex<Vec<Loss>>,
        start: Instant,
        power: bool,
    ) -> Self {
        Injector {
            c,
            hits,
            losses,
            start,
            out: Vec::new(),
            replaced: 0,
            power,
        }
    }
}

impl Injector<'_> {
    /// The zone a fault hits, from now for `dur`.
    fn hit(&self, zone: usize, dur: Duration) {
        let at = Instant::now();
        self.hits.lock().push(Hit {
            zone,
            at,
            until: at + dur,
        });
    }

    fn say(&mut self, what: String) {
        let at = (Instant::now() - self.start).as_millis();
        self.out.push(format!("{at} ms: {what}"));
    }

    /// A node that runs, at random (none when every node is off).
    fn running(&self, rng: &mut Rng) -> Option<NodeId> {
        let up: Vec<NodeId> = self
            .c
            .node_ids()
            .into_iter()
            .filter(|&id| self.c.net.is_up(id))
            .collect();
        (!up.is_empty()).then(|| up[rng.below(up.len() as u64) as usize])
    }

    /// Wait `dur` while a fault is under way; with power losses among the kinds,
    /// one may come meanwhile.
    async fn hold(&mut self, rng: &mut Rng, dur: Duration) {
        if !(self.power && rng.chance(POWER_DURING)) {
            tokio::time::sleep(dur).await;
            return;
        }
        let t0 = Instant::now();
        let first = Duration::from_millis(rng.below(dur.as_millis() as u64 / 2 + 1));
        tokio::time::sleep(first).await;
        self.power_loss(rng).await;
        tokio::time::sleep_until(t0 + dur).await;
    }

    /// One node, one zone or the whole site loses power, and comes back after a
    /// while (quick, before the failure detector notices, half the time). Nodes
    /// already off lose their page cache too, and are left off.
    async fn power_loss(&mut self, rng: &mut Rng) {
        let model = self.c.model().clone();
        let (ids, scope): (Vec<NodeId>, String) = match rng.below(10) {
            0..=4 => {
                let id = NodeId(1 + rng.below(model.nodes() as u64));
                (vec![id], format!("node {id}"))
            }
            5..=7 => {
                let z = rng.below(model.zones as u64) as usize;
                let ids = self
                    .c
                    .node_ids()
                    .into_iter()
                    .filter(|id| model.zone_of(id.0) == z)
                    .collect();
                (ids, format!("zone {}", Model::zone_name(z)))
            }
            _ => (self.c.node_ids(), "the whole site".to_string()),
        };
        let off = if rng.chance(0.5) {
            Duration::from_millis(200 + rng.below(2000))
        } else {
            Duration::from_millis(2000 + rng.below(8000))
        };
        let mut zones: Vec<usize> = ids.iter().map(|id| model.zone_of(id.0)).collect();
        zones.dedup();
        for z in zones {
            self.hit(z, off);
        }
        let was_up: Vec<NodeId> = ids
            .iter()
            .copied()
            .filter(|&id| self.c.net.is_up(id))
            .collect();
        let mut unflushed = 0;
        for &id in &ids {
            unflushed += self.c.power_off(id, &mut |p| rng.chance(p));
        }
        self.losses.lock().push(Loss {
            at: Instant::now(),
            nodes: ids.clone(),
        });
        self.say(format!(
            "{scope} loses power for {} ms ({unflushed} objects had unflushed writes)",
            off.as_millis()
        ));
        tokio::time::sleep(off).await;
        for id in was_up {
            self.c.restart(id).await;
        }
    }

    /// Node `id`'s disk failed (its guard latched): the operator replaces it while
    /// the run may lose that many, else restarts the node on it once the drive
    /// remapped its bad sectors (`power_cycle`: after a power cycle of the host).
    async fn after_disk_failure(&mut self, id: NodeId, power_cycle: bool, rng: &mut Rng) {
        if self.replaced < REPLACED_MAX && rng.chance(0.5) {
            self.replaced += 1;
            self.c.replace_disk(id);
            self.losses.lock().push(Loss {
                at: Instant::now(),
                nodes: vec![id],
            });
            self.say(format!("node {id} restarts on a new, empty disk"));
        } else if power_cycle {
            let n = self.c.power_off(id, &mut |p| rng.chance(p));
            self.losses.lock().push(Loss {
                at: Instant::now(),
                nodes: vec![id],
            });
            self.say(format!(
                "node {id}'s host is power-cycled ({n} objects had unflushed writes)"
            ));
        } else {
            self.c.crash(id);
            self.c.with_off_disk(id, |m| m.remap_bad_sectors());
            self.say(format!(
                "node {id} restarts on its disk, bad sectors remapped"
            ));
        }
        self.c.restart(id).await;
    }

    /// The faults of a run, one after the other, each healed before the next (a
    /// power loss may come while one is under way).
    pub(super) async fn run(&mut self, rng: &mut Rng, end: Instant, kinds: &[FaultKind]) {
        if kinds.is_empty() {
            return;
        }
        let c = self.c.clone();
        let model = c.model().clone();
        let n = model.nodes() as u64;
        let mut t = self.start + Duration::from_secs(2 + rng.below(4));
        while t + Duration::from_secs(6) < end {
            tokio::time::sleep_until(t).await;
            let dur = Duration::from_millis(2000 + rng.below(10_000));
            match kinds[rng.below(kinds.len() as u64) as usize] {
                FaultKind::Crash => {
                    let id = NodeId(1 + rng.below(n));
                    self.hit(model.zone_of(id.0), dur);
                    self.say(format!("node {id} crashes for {} ms", dur.as_millis()));
                    c.crash(id);
                    self.hold(rng, dur).await;
                    c.restart(id).await;
                }
                FaultKind::Cut => {
                    let z = rng.below(model.zones as u64) as usize;
                    self.hit(z, dur);
                    self.say(format!(
                        "zone {} is cut off for {} ms",
                        Model::zone_name(z),
                        dur.as_millis()
                    ));
                    c.net.set_cut(z, true);
                    self.hold(rng, dur).await;
                    c.net.set_cut(z, false);
                    c.publish();
                }
                FaultKind::Lose => {
                    let z = rng.below(model.zones as u64) as usize;
                    self.hit(z, dur);
                    self.say(format!(
                        "zone {} is lost (every node crashes) for {} ms",
                        Model::zone_name(z),
                        dur.as_millis()
                    ));
                    let ids: Vec<NodeId> = c
                        .node_ids()
                        .into_iter()
                        .filter(|id| model.zone_of(id.0) == z)
                        .collect();
                    for &id in &ids {
                        c.crash(id);
                    }
                    self.hold(rng, dur).await;
                    for &id in &ids {
                        c.restart(id).await;
                    }
                }
                FaultKind::Flip => {
                    let id = NodeId(1 + rng.below(n));
                    let flipped = c.node(id).and_then(|node| {
                        let mem = node.mem.as_ref()?;
                        let objs = drove_objstore::ObjectStore::list(mem.as_ref()).ok()?;
                        if objs.is_empty() {
                            return None;
                        }
                        let oid = objs[rng.below(objs.len() as u64) as usize];
                        let block = rng.below(u64::from(OBJECT_SIZE) / BLOCK as u64);
                        mem.corrupt_block(oid, block);
                        Some((oid, block))
                    });
                    match flipped {
                        Some((oid, block)) => {
                            self.say(format!("block {block} of object {oid} on node {id} flips"))
                        }
                        None => self.say(format!("node {id} holds no object to flip")),
                    }
                }
                FaultKind::Power => self.power_loss(rng).await,
                FaultKind::Eio => {
                    let Some(id) = self.running(rng) else {
                        continue;
                    };
                    let bad = c.node(id).and_then(|node| {
                        let mem = node.mem.clone()?;
                        let objs = drove_objstore::ObjectStore::list(mem.as_ref()).ok()?;
                        if objs.is_empty() {
                            return None;
                        }
                        let oid = objs[rng.below(objs.len() as u64) as usize];
                        let block = rng.below(u64::from(OBJECT_SIZE) / BLOCK as u64);
                        mem.eio_block(oid, block);
                        Some((oid, block))
                    });
                    let Some((oid, block)) = bad else {
                        self.say(format!("node {id} holds no object to fail"));
                        continue;
                    };
                    self.hit(model.zone_of(id.0), dur);
                    self.say(format!(
                        "block {block} of object {oid} on node {id} reads EIO; {} ms later the operator acts",
                        dur.as_millis()
                    ));
                    self.hold(rng, dur).await;
                    self.after_disk_failure(id, false, rng).await;
                }
                FaultKind::FsyncFail => {
                    let Some(id) = self.running(rng) else {
                        continue;
                    };
                    let Some(mem) = c.node(id).and_then(|node| node.mem.clone()) else {
                        continue;
                    };
                    mem.fail_next_flush();
                    self.hit(model.zone_of(id.0), dur);
                    self.say(format!(
                        "node {id}'s next fsync fails; {} ms later the operator acts",
                        dur.as_millis()
                    ));
                    self.hold(rng, dur).await;
                    if c.disk_failed(id) {
                        self.after_disk_failure(id, true, rng).await;
                    } else {
                        // No flush came: the disk is sound again.
                        if let Some(m) = c.node(id).and_then(|node| node.mem.clone()) {
                            m.disarm();
                        }
                    }
                }
                FaultKind::Enospc => {
                    let Some(id) = self.running(rng) else {
                        continue;
                    };
                    let Some(mem) = c.node(id).and_then(|node| node.mem.clone()) else {
                        continue;
                    };
                    let room = rng.below(16);
                    mem.set_capacity(Some(mem.blocks_used() + room));
                    self.hit(model.zone_of(id.0), dur);
                    self.say(format!(
                        "node {id}'s disk is full ({room} blocks left) for {} ms",
                        dur.as_millis()
                    ));
                    self.hold(rng, dur).await;
                    if let Some(m) = c.node(id).and_then(|node| node.mem.clone()) {
                        m.set_capacity(None);
                    }
                }
                FaultKind::SlowDisk => {
                    let id = NodeId(1 + rng.below(n));
                    let cost = Duration::from_millis(1000 + rng.below(4000));
                    self.hit(model.zone_of(id.0), dur);
                    self.say(format!(
                        "node {id}'s disk takes {} ms per fsync for {} ms",
                        cost.as_millis(),
                        dur.as_millis()
                    ));
                    c.net.set_slow(id, Some(cost));
                    self.hold(rng, dur).await;
                    c.net.set_slow(id, None);
                }
            }
            t = Instant::now() + Duration::from_millis(1000 + rng.below(4000));
        }
    }
}
