//! `drove sim dc-loss`: the time a cluster takes to recover from the loss of one
//! datacenter. VMs in every zone fill their sync VDIs; then every node of the last
//! zone crashes for good. The failure detector marks them down, the objects they
//! held are placed on the nodes left, and recovery copies them. The run reports
//! when the last node was marked down, when every node left was clean at the
//! final epoch, the epochs it took, and the `List` requests and bytes moved.
//!
//! With `return_after`, the zone then comes back (a datacenter's power restored):
//! its nodes restart on the disks they had, are marked up, take back the objects
//! placement gives them and make their copies current, comparing them with the
//! copies made meanwhile; the run reports the same figures for that phase.
use drove_types::{NodeId, NodeState, WritePolicy};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

use crate::cluster::{Disks, SimCluster};
use crate::model::Model;

const OBJECT_SIZE: u32 = drove_types::DEFAULT_OBJECT_SIZE;

/// What a datacenter-loss run is made of.
#[derive(Debug, Clone, Serialize)]
pub struct DcLossOpts {
    /// The cluster and its costs.
    pub model: Model,
    /// VDIs, spread over the zones.
    pub vdis: usize,
    /// Each VDI's size, MiB (all of it written before the loss).
    pub disk_mib: u64,
    /// After the nodes left are clean, bring the lost zone back this much later.
    pub return_after: Option<Duration>,
}

/// What a datacenter-loss run measured.
#[derive(Debug, Clone, Serialize)]
pub struct DcLossReport {
    /// What ran.
    pub opts: DcLossOpts,
    /// The zone lost.
    pub zone: String,
    /// Objects written before the loss.
    pub objects: u64,
    /// Simulated seconds from the loss until every node of the zone was marked down.
    pub marked_down_s: f64,
    /// Simulated seconds from the loss until every node left was clean at the last
    /// epoch (every copy the cluster now places on it made current).
    pub recovered_s: f64,
    /// Epochs from the loss to the end.
    pub epochs: u64,
    /// `List` requests between nodes from the loss to the end.
    pub lists: u64,
    /// Bytes sent between nodes from the loss to the end.
    pub bytes: u64,
    /// Whether recovery finished within the run's limit (10 simulated minutes).
    pub finished: bool,
    /// Objects digested for a peer from the loss to the end, and the bytes those
    /// digests read.
    pub digests: u64,
    /// Bytes read by those digests.
    pub digest_read_bytes: u64,
    /// The zone's return, when asked for.
    pub returned: Option<ReturnReport>,
}

/// What the return of the lost zone measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReturnReport {
    /// Simulated seconds from the restart until every node of the zone was up.
    pub marked_up_s: f64,
    /// Simulated seconds from the restart until every node was clean at the last
    /// epoch.
    pub recovered_s: f64,
    /// Epochs from the restart to the end.
    pub epochs: u64,
    /// `List` requests between nodes.
    pub lists: u64,
    /// Bytes sent between nodes.
    pub bytes: u64,
    /// Objects digested for a peer.
    pub digests: u64,
    /// Bytes read by those digests.
    pub digest_read_bytes: u64,
    /// Whether it finished within the run's limit (10 simulated minutes).
    pub finished: bool,
}

/// Run the failure detector until `done` says the state reached is the one
/// waited for, or `limit`; whether it was reached, and when `marked` first held.
async fn until(
    c: &SimCluster,
    limit: Instant,
    marked: &dyn Fn(&drove_meta::MetaState) -> bool,
    done: &dyn Fn(&drove_meta::MetaState) -> bool,
) -> (bool, Option<Duration>) {
    let t0 = Instant::now();
    let mut since = BTreeMap::new();
    let mut when = None;
    while Instant::now() < limit {
        c.detect(&mut since).await;
        let st = c.state();
        if when.is_none() && marked(&st) {
            when = Some(t0.elapsed());
        }
        if when.is_some() && done(&st) {
            return (true, when);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (false, when)
}

/// Whether every node of `ids` is clean at the current epoch.
fn clean(c: &SimCluster, ids: &[NodeId], st: &drove_meta::MetaState) -> bool {
    ids.iter().all(|&id| {
        c.node(id).is_some_and(|n| {
            let p = n.recoverer.progress();
            p.clean && p.epoch == st.map.epoch.0
        })
    })
}

/// Whether every node of `ids` is in `state`.
fn all_in(ids: &[NodeId], st: &drove_meta::MetaState, state: NodeState) -> bool {
    ids.iter()
        .all(|id| st.map.node(*id).is_some_and(|n| n.state == state))
}

/// Run it.
pub fn run(opts: &DcLossOpts) -> anyhow::Result<DcLossReport> {
    let rt = crate::runtime()?;
    rt.block_on(dc_loss(opts.clone()))
}

async fn dc_loss(opts: DcLossOpts) -> anyhow::Result<DcLossReport> {
    let model = opts.model.clone();
    let c = SimCluster::new(model.clone(), OBJECT_SIZE, Disks::Model);
    let size = opts.disk_mib << 20;
    let vms = c.start_vms(opts.vdis, size, WritePolicy::Sync).await?;
    c.fill(&vms, size).await?;
    let objects = (opts.vdis as u64) * size.div_ceil(u64::from(OBJECT_SIZE));
    let lost = model.zones - 1;
    let ids: Vec<NodeId> = c
        .node_ids()
        .into_iter()
        .filter(|id| model.zone_of(id.0) == lost)
        .collect();
    let left: Vec<NodeId> = c
        .node_ids()
        .into_iter()
        .filter(|id| !ids.contains(id))
        .collect();
    let epoch0 = c.epoch();
    let _ = c.net.take_traffic();
    let t0 = Instant::now();
    for &id in &ids {
        c.crash(id);
    }
    let (finished, marked) = until(
        &c,
        t0 + LIMIT,
        &|st| all_in(&ids, st, NodeState::Down),
        &|st| clean(&c, &left, st),
    )
    .await;
    let recovered = t0.elapsed();
    let t = c.net.take_traffic();
    let epochs = c.epoch() - epoch0;
    let mut returned = None;
    if let (true, Some(after)) = (finished, opts.return_after) {
        tokio::time::sleep(after).await;
        let epoch1 = c.epoch();
        let t1 = Instant::now();
        for &id in &ids {
            c.restart(id).await;
        }
        let all = c.node_ids();
        let (finished, marked) = until(
            &c,
            t1 + LIMIT,
            &|st| all_in(&ids, st, NodeState::Up),
            &|st| clean(&c, &all, st),
        )
        .await;
        let r = c.net.take_traffic();
        returned = Some(ReturnReport {
            marked_up_s: marked.map_or(f64::NAN, |d| d.as_secs_f64()),
            recovered_s: t1.elapsed().as_secs_f64(),
            epochs: c.epoch() - epoch1,
            lists: r.lists,
            bytes: r.bytes,
            digests: r.digests,
            digest_read_bytes: r.digest_read_bytes,
            finished,
        });
    }
    Ok(DcLossReport {
        opts,
        zone: Model::zone_name(lost),
        objects,
        marked_down_s: marked.map_or(f64::NAN, |d| d.as_secs_f64()),
        recovered_s: recovered.as_secs_f64(),
        epochs,
        lists: t.lists,
        bytes: t.bytes,
        finished,
        digests: t.digests,
        digest_read_bytes: t.digest_read_bytes,
        returned,
    })
}

/// How long a phase may take, simulated.
const LIMIT: Duration = Duration::from_secs(600);

/// The report as text.
pub fn text(r: &DcLossReport) -> String {
    let mut s = String::from("drove sim dc-loss: one datacenter lost for good\nModel:\n");
    for line in r.opts.model.describe() {
        s.push_str(&format!("  {line}\n"));
    }
    s.push_str(&format!(
        "  failure detector verdicts: {}\n",
        if r.opts.model.batch_verdicts {
            "one command per round (JudgeNodes)"
        } else {
            "one command per node"
        }
    ));
    s.push_str(&format!(
        "{} VDIs of {} MiB ({} objects of 4 MiB, copies {}); zone {} lost\n",
        r.opts.vdis, r.opts.disk_mib, r.objects, r.opts.model.copies, r.zone
    ));
    s.push_str(&format!(
        "every node of the zone marked down after {:.1} s; every node left clean after {:.1} s{}\n",
        r.marked_down_s,
        r.recovered_s,
        if r.finished {
            ""
        } else {
            " (NOT finished: the run's limit)"
        }
    ));
    s.push_str(&format!(
        "{} epochs, {} List requests, {:.1} MB sent between nodes, {} objects digested for a peer ({:.1} MB read for them)\n",
        r.epochs,
        r.lists,
        r.bytes as f64 / 1e6,
        r.digests,
        r.digest_read_bytes as f64 / 1e6
    ));
    if let Some(b) = &r.returned {
        s.push_str(&format!(
            "zone {} back: every node of it up after {:.1} s; every node clean after {:.1} s{}\n",
            r.zone,
            b.marked_up_s,
            b.recovered_s,
            if b.finished {
                ""
            } else {
                " (NOT finished: the run's limit)"
            }
        ));
        s.push_str(&format!(
            "{} epochs, {} List requests, {:.1} MB sent between nodes, {} objects digested for a peer ({:.1} MB read for them)\n",
            b.epochs,
            b.lists,
            b.bytes as f64 / 1e6,
            b.digests,
            b.digest_read_bytes as f64 / 1e6
        ));
    }
    s
}
