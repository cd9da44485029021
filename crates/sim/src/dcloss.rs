//! `drove sim dc-loss`: the time a cluster takes to recover from the loss of one
//! datacenter. VMs in every zone fill their sync VDIs; then every node of the last
//! zone crashes for good. The failure detector marks them down, the objects they
//! held are placed on the nodes left, and recovery copies them. The run reports
//! when the last node was marked down, when every node left was clean at the
//! final epoch, the epochs it took, and the `List` requests and bytes moved.
//!
//! The metadata is the model's or openraft on every node ([`MetaMode`]). With
//! openraft, the zone lost is by default the one holding the metadata leader at
//! the loss (the hard case: the nodes left elect a new leader before its failure
//! detector, which first waits one full timeout, can mark the lost nodes down);
//! the lost nodes' metadata is shut down as a crash does. Meanwhile the VMs of the
//! other zones keep writing ([`writes`]), and the run reports their longest pause
//! next to the detector's timeout.
//!
//! With `return_after`, the zone then comes back (a datacenter's power restored):
//! its nodes restart on the disks they had, are marked up, take back the objects
//! placement gives them and make their copies current, comparing them with the
//! copies made meanwhile; the run reports the same figures for that phase.
use drove_types::{NodeId, NodeState, WritePolicy};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::cluster::{Disks, MetaMode, SimCluster};
use crate::model::Model;

mod writes;

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
    /// The metadata: the model, or openraft on every node.
    pub meta: MetaMode,
    /// The zone to lose (`z1`, ...); `None`: with openraft, the zone holding the
    /// metadata leader at the loss, in the model the last zone.
    pub zone: Option<String>,
    /// The seed of every random choice drove's code makes (openraft's election
    /// timeouts among them).
    pub seed: u64,
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
    /// With openraft: whether the zone lost held the metadata leader at the loss.
    pub zone_had_leader: Option<bool>,
    /// With openraft: the metadata voters the zone lost held at the loss.
    pub zone_voters: Option<usize>,
    /// With openraft: the metadata voters at the loss.
    pub voters: Option<usize>,
    /// With openraft: simulated seconds from the loss until a node outside the
    /// zone lost led the metadata.
    pub new_leader_s: Option<f64>,
    /// With openraft: that leader.
    pub new_leader: Option<u64>,
    /// The failure detector's timeout, seconds: a node silent this long is marked
    /// down (openraft: the cluster's `down_after_ms`; the model: its `down_after`).
    pub detector_s: f64,
    /// The longest pause, simulated seconds, of any VM writing outside the zone
    /// lost: the longest time, ending after the loss, between two of its
    /// acknowledged writes (or its last and the end of the phase).
    pub write_pause_s: f64,
    /// Writes those VMs had acknowledged from the loss to the end of the phase.
    pub writes_acked: u64,
    /// Writes of theirs that failed or did not end within 30 s.
    pub writes_failed: u64,
    /// Whether every running node was clean at the metadata's last epoch at the end
    /// of the run.
    pub clean_at_end: bool,
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

/// Run it. Every random choice drove's code makes on this thread follows
/// `opts.seed`: the same options give the same report.
pub fn run(opts: &DcLossOpts) -> anyhow::Result<DcLossReport> {
    let rt = crate::runtime()?;
    drove_types::random::seed_thread(opts.seed);
    let report = rt.block_on(dc_loss(opts.clone()));
    // The dead runs' tasks end with the runtime, still on the seeded thread.
    drop(rt);
    drove_types::random::unseed_thread();
    report
}

/// The zone (0-based) named `name` in a model of `zones` zones, or why not.
pub fn zone_index(name: &str, zones: usize) -> Result<usize, String> {
    (0..zones)
        .find(|&z| Model::zone_name(z) == name)
        .ok_or_else(|| {
            let names: Vec<String> = (0..zones).map(Model::zone_name).collect();
            format!("Unknown zone '{name}': the zones are {}", names.join(", "))
        })
}

/// The metadata leader at the loss, with openraft: its zone, and the voters.
struct AtLoss {
    leader_zone: Option<usize>,
    voters: Vec<NodeId>,
}

fn at_loss(c: &SimCluster) -> Option<AtLoss> {
    if c.meta_mode() != MetaMode::Raft {
        return None;
    }
    let leader = c.leader()?;
    let s = leader.status();
    Some(AtLoss {
        leader_zone: Some(c.model().zone_of(s.node_id.0)),
        voters: s.voters,
    })
}

/// Wait until a node outside zone `lost` leads the metadata (checked every 10
/// ms), or `limit`; when, after `t0`, and which.
async fn new_leader(
    c: Arc<SimCluster>,
    lost: usize,
    t0: Instant,
    limit: Instant,
) -> Option<(Duration, NodeId)> {
    while Instant::now() < limit {
        if let Some(m) = c.leader() {
            let id = m.node_id();
            if c.model().zone_of(id.0) != lost {
                return Some((t0.elapsed(), id));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// How long the VMs write before the loss (their pauses count from the loss).
const WRITE_BEFORE: Duration = Duration::from_secs(1);

async fn dc_loss(opts: DcLossOpts) -> anyhow::Result<DcLossReport> {
    let model = opts.model.clone();
    let c = SimCluster::with_meta(model.clone(), OBJECT_SIZE, Disks::Model, opts.meta)
        .await
        .map_err(|e| anyhow::anyhow!("the simulated cluster did not form: {e}"))?;
    let size = opts.disk_mib << 20;
    let vms = c.start_vms(opts.vdis, size, WritePolicy::Sync).await?;
    c.fill(&vms, size).await?;
    let objects = (opts.vdis as u64) * size.div_ceil(u64::from(OBJECT_SIZE));
    let asked = match &opts.zone {
        Some(name) => Some(zone_index(name, model.zones).map_err(|e| anyhow::anyhow!(e))?),
        None => None,
    };
    let left_vms = |lost: usize| -> Vec<crate::cluster::Vm> {
        vms.iter()
            .filter(|vm| model.zone_of(vm.node.0) != lost)
            .cloned()
            .collect()
    };
    // The zone holding the leader now, a second before the loss, while the VMs
    // outside it start writing; the report says whether it still held it at the
    // loss.
    let lost = asked
        .or_else(|| at_loss(&c).and_then(|s| s.leader_zone))
        .unwrap_or(model.zones - 1);
    let writers = writes::Writers::start(&c, &left_vms(lost), size, Instant::now() + WRITE_BEFORE);
    tokio::time::sleep(WRITE_BEFORE).await;
    let seen = at_loss(&c);
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
    tracing::info!(zone = %Model::zone_name(lost), "dc-loss: the zone is lost");
    for &id in &ids {
        c.crash(id);
    }
    let leader = (opts.meta == MetaMode::Raft)
        .then(|| tokio::spawn(new_leader(c.clone(), lost, t0, t0 + LIMIT)));
    let (finished, marked) = until(
        &c,
        t0 + LIMIT,
        &|st| all_in(&ids, st, NodeState::Down),
        &|st| clean(&c, &left, st),
    )
    .await;
    let recovered = t0.elapsed();
    let w = writers.stop().await;
    let t = c.net.take_traffic();
    let epochs = c.epoch() - epoch0;
    let leader = match leader {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    let detector = match opts.meta {
        MetaMode::Raft => Duration::from_millis(c.state().settings.down_after_ms),
        MetaMode::Model => model.down_after,
    };
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
    let running: Vec<NodeId> = c
        .node_ids()
        .into_iter()
        .filter(|&id| !c.is_off(id))
        .collect();
    let clean_at_end = clean(&c, &running, &c.state());
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
        zone_had_leader: seen.as_ref().map(|s| s.leader_zone == Some(lost)),
        zone_voters: seen.as_ref().map(|s| {
            s.voters
                .iter()
                .filter(|v| model.zone_of(v.0) == lost)
                .count()
        }),
        voters: seen.as_ref().map(|s| s.voters.len()),
        new_leader_s: leader.map(|(d, _)| d.as_secs_f64()),
        new_leader: leader.map(|(_, id)| id.0),
        detector_s: detector.as_secs_f64(),
        write_pause_s: w.longest.as_secs_f64(),
        writes_acked: w.acked,
        writes_failed: w.failed,
        clean_at_end,
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
        "metadata: {}\n",
        match r.opts.meta {
            MetaMode::Raft =>
                "openraft on every node (seed ".to_string() + &r.opts.seed.to_string() + ")",
            MetaMode::Model => "the model (one state machine, a modelled commit)".to_string(),
        }
    ));
    if let (Some(had), Some(zv), Some(v)) = (r.zone_had_leader, r.zone_voters, r.voters) {
        s.push_str(&format!(
            "zone {} held the metadata leader at the loss: {}; it held {} of the {} voters\n",
            r.zone,
            if had { "yes" } else { "no" },
            zv,
            v
        ));
    }
    if r.opts.meta == MetaMode::Raft {
        match (r.new_leader_s, r.new_leader) {
            (Some(t), Some(id)) => s.push_str(&format!(
                "a node outside the zone (node {id}) led the metadata {t:.2} s after the loss\n"
            )),
            _ => s.push_str("no node outside the zone led the metadata before the run's limit\n"),
        }
    }
    s.push_str(&format!(
        "VMs outside the zone: {} writes acknowledged, {} failed; longest write pause {:.2} s (the failure detector's timeout: {:.1} s)\n",
        r.writes_acked, r.writes_failed, r.write_pause_s, r.detector_s
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
    s.push_str(&format!(
        "every running node clean at the last epoch at the end: {}\n",
        if r.clean_at_end { "yes" } else { "NO" }
    ));
    s
}
