//! `drove sim dc-loss`: the time a cluster takes to recover from the loss of one
//! datacenter. VMs in every zone fill their sync VDIs; then every node of the last
//! zone crashes for good. The failure detector marks them down, the objects they
//! held are placed on the nodes left, and recovery copies them. The run reports
//! when the last node was marked down, when every node left was clean at the
//! final epoch, the epochs it took, and the `List` requests and bytes moved.
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
    let epoch0 = c.epoch();
    let _ = c.net.take_traffic();
    let t0 = Instant::now();
    for &id in &ids {
        c.crash(id);
    }
    let mut since = BTreeMap::new();
    let mut marked = None;
    let limit = t0 + Duration::from_secs(600);
    let mut finished = false;
    while Instant::now() < limit {
        c.detect(&mut since);
        let st = c.state();
        if marked.is_none()
            && ids
                .iter()
                .all(|id| st.map.node(*id).is_some_and(|n| n.state == NodeState::Down))
        {
            marked = Some(t0.elapsed());
        }
        if marked.is_some() {
            let clean = c
                .node_ids()
                .into_iter()
                .filter(|id| !ids.contains(id))
                .all(|id| {
                    c.node(id).is_some_and(|n| {
                        let p = n.recoverer.progress();
                        p.clean && p.epoch == st.map.epoch.0
                    })
                });
            if clean {
                finished = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = c.net.take_traffic();
    Ok(DcLossReport {
        opts,
        zone: Model::zone_name(lost),
        objects,
        marked_down_s: marked.map_or(f64::NAN, |d| d.as_secs_f64()),
        recovered_s: t0.elapsed().as_secs_f64(),
        epochs: c.epoch() - epoch0,
        lists: t.lists,
        bytes: t.bytes,
        finished,
    })
}

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
        "{} epochs, {} List requests, {:.1} MB sent between nodes\n",
        r.epochs,
        r.lists,
        r.bytes as f64 / 1e6
    ));
    s
}
