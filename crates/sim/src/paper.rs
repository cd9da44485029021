//! `drove sim paper`: the paper's experiment at its scale, on the simulator. Each
//! point (write policy, operation, X clients, with and without the delay between
//! zones) is a fresh simulated cluster: X VMs spread over the zones, each writing
//! or reading its own VDI (home zone: its own) through a node of its zone, with
//! fio's pattern of `drove bench paper` (1 MiB sequential or 4 KiB random, 4 in
//! flight per VM), for the simulated seconds asked. The table has the paper's
//! indexes, computed by drove-paperbench's own code from the points.
//!
//! What is simulated and what is a model parameter is printed with the table: the
//! network and the disks are models ([`Model`]), drove's gateway, replica side and
//! metadata state machine are its own code. There is no baseline: qemu-nbd is not
//! drove's code to run.
use drove_paperbench::index::{compute_indexes, fmt_ratio, lookup, IndexKind};
use drove_paperbench::results::{PointResult, RepeatSample, Traffic};
use drove_paperbench::{Op, System};
use drove_types::{ObjectId, WritePolicy};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::cluster::{Disks, SimCluster};
use crate::model::Model;
use crate::rng::Rng;

/// The objects of the paper runs' VDIs (drove's default).
const OBJECT_SIZE: u32 = drove_types::DEFAULT_OBJECT_SIZE;

/// What `drove sim paper` runs.
#[derive(Debug, Clone, Serialize)]
pub struct PaperOpts {
    /// The cluster and its costs.
    pub model: Model,
    /// Clients at once.
    pub parallel: Vec<usize>,
    /// Simulated seconds each point measures.
    pub secs: u64,
    /// Simulated seconds each point's clients run before it measures (the
    /// zone-sync lag fills in its first seconds; see `docs/simulator.md`).
    pub warmup_secs: u64,
    /// Each VM's disk, MiB.
    pub disk_mib: u64,
    /// Requests in flight per VM.
    pub iodepth: usize,
    /// Write policies.
    pub policies: Vec<WritePolicy>,
    /// Operations.
    pub ops: Vec<Op>,
    /// The seed of the random offsets.
    pub seed: u64,
    /// The metadata each point's cluster runs: the state machine applied directly,
    /// or openraft on every node (slower to start: 88 nodes join one by one).
    pub meta: crate::cluster::MetaMode,
}

impl Default for PaperOpts {
    fn default() -> Self {
        PaperOpts {
            model: Model::default(),
            parallel: vec![1, 10, 20, 44],
            secs: 10,
            warmup_secs: 5,
            disk_mib: 16,
            iodepth: 4,
            policies: vec![WritePolicy::Sync, WritePolicy::ZoneSync],
            ops: Op::ALL.to_vec(),
            seed: 1,
            meta: crate::cluster::MetaMode::Model,
        }
    }
}

impl PaperOpts {
    /// The X of every point: `parallel`, with 1 always there (first when added).
    fn xs(&self) -> Vec<usize> {
        let mut xs = self.parallel.clone();
        if !xs.contains(&1) {
            xs.insert(0, 1);
        }
        xs
    }
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct PaperReport {
    /// What ran.
    pub opts: PaperOpts,
    /// Every point.
    pub points: Vec<PointResult>,
    /// The indexes.
    pub indexes: Vec<drove_paperbench::index::IndexRow>,
}

/// Run every point; `progress` hears of each as it ends (with the wall time it
/// took, which is not part of the report).
pub fn run(
    opts: &PaperOpts,
    progress: &(dyn Fn(&PointResult, Duration) + Sync),
) -> anyhow::Result<PaperReport> {
    run_on(opts, 1, progress)
}

/// [`run`] on `threads` threads: each point is a cluster on its own runtime and
/// clock, so points run side by side and each gives what it gives alone. The
/// report keeps the points' order; `progress` hears of them as they end. The
/// points with the most clients go first, so that a long one does not start last.
pub fn run_on(
    opts: &PaperOpts,
    threads: usize,
    progress: &(dyn Fn(&PointResult, Duration) + Sync),
) -> anyhow::Result<PaperReport> {
    let delay_ms = u64::try_from(opts.model.zone_delay.as_millis()).unwrap_or(u64::MAX);
    let mut todo = Vec::new();
    for delay in [0, delay_ms] {
        for &policy in &opts.policies {
            for &op in &opts.ops {
                for x in opts.xs() {
                    todo.push((policy, op, x, delay));
                }
            }
        }
    }
    // Work order: most clients first (stable, so ties keep the report's order).
    let mut order: Vec<usize> = (0..todo.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(todo[i].2));
    let next = AtomicU64::new(0);
    let done: parking_lot::Mutex<Vec<Option<PointResult>>> =
        parking_lot::Mutex::new(vec![None; todo.len()]);
    let err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, todo.len().max(1)) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                if k >= order.len() || err.lock().is_some() {
                    return;
                }
                let i = order[k];
                let (policy, op, x, delay) = todo[i];
                let wall = std::time::Instant::now();
                match run_point(opts, policy, op, x, delay) {
                    Ok(p) => {
                        progress(&p, wall.elapsed());
                        done.lock()[i] = Some(p);
                    }
                    Err(e) => *err.lock() = Some(e),
                }
            });
        }
    });
    if let Some(e) = err.into_inner() {
        return Err(e);
    }
    let points: Vec<PointResult> = done.into_inner().into_iter().flatten().collect();
    let systems: Vec<System> = opts.policies.iter().map(|&p| System::drove(p)).collect();
    let indexes = compute_indexes(&points, &systems, &opts.xs(), delay_ms);
    Ok(PaperReport {
        opts: opts.clone(),
        points,
        indexes,
    })
}

/// One point on a fresh cluster and clock.
fn run_point(
    opts: &PaperOpts,
    policy: WritePolicy,
    op: Op,
    x: usize,
    delay_ms: u64,
) -> anyhow::Result<PointResult> {
    let rt = crate::runtime()?;
    let mut model = opts.model.clone();
    model.zone_delay = Duration::from_millis(delay_ms);
    let (per_client, traffic) = rt.block_on(point(opts, model, policy, op, x))?;
    let sample = RepeatSample {
        per_client_mbps: per_client,
        cpu_busy: 0.0,
        own_cpu: 0.0,
    };
    Ok(PointResult::from_repeats(
        System::drove(policy),
        op,
        x,
        delay_ms,
        &[sample],
        traffic,
    ))
}

fn block_size(op: Op) -> u64 {
    match op {
        Op::BlockWrite | Op::BlockRead => 1 << 20,
        Op::SmallWrite | Op::SmallRead => 4096,
    }
}

async fn point(
    opts: &PaperOpts,
    model: Model,
    policy: WritePolicy,
    op: Op,
    x: usize,
) -> anyhow::Result<(Vec<f64>, Traffic)> {
    let c = SimCluster::with_meta(model.clone(), OBJECT_SIZE, Disks::Model, opts.meta).await?;
    let size = opts.disk_mib << 20;
    let vms = c.start_vms(x, size, policy).await?;
    // Reads read written data: every disk is written once first (not measured).
    if !op.is_write() {
        c.fill(&vms, size).await?;
    }
    let _ = c.net.take_traffic();
    // The clients start now; what ends before `from` is not counted.
    let from = Instant::now() + Duration::from_secs(opts.warmup_secs);
    let end = from + Duration::from_secs(opts.secs);
    let bs = block_size(op);
    let mut tasks = Vec::new();
    let counters: Vec<Arc<AtomicU64>> = (0..x).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let errors = Arc::new(AtomicU64::new(0));
    for (i, vm) in vms.iter().enumerate() {
        for d in 0..opts.iodepth {
            let c = c.clone();
            let (name, node, g) = (vm.name.clone(), vm.node, vm.generation);
            let done = counters[i].clone();
            let errors = errors.clone();
            let mut rng = Rng::new(opts.seed ^ ((i as u64) << 16) ^ d as u64);
            let model = model.clone();
            let depth = opts.iodepth as u64;
            tasks.push(tokio::spawn(async move {
                let vdi = c.vdi(&name).expect("created above");
                let sn = c.node(node).expect("running");
                let gw = sn.gateway.clone();
                let blocks = size / bs;
                // fio's sequential jobs share one offset per VM; each in-flight
                // request takes the next block (d, d + depth, ...).
                let mut seq = d as u64;
                let data = bytes::Bytes::from(vec![0x5au8; bs as usize]);
                // Whether this node holds a copy of an object, on the map of an epoch
                // (placing is the simulator's own cost here, not the model's).
                let mut placed = std::collections::BTreeMap::new();
                // Where this client is in the model's time (see net::resume).
                let mut now = Instant::now();
                while Instant::now() < end {
                    let block = match op {
                        Op::BlockWrite | Op::BlockRead => {
                            let b = seq % blocks;
                            seq += depth;
                            b
                        }
                        _ => rng.below(blocks),
                    };
                    let (oid, off) = at(vdi.id, block * bs);
                    // The gateway's own replica, when it holds one, is written (or
                    // read) on this node's disk: its bytes join the client's cost.
                    let map = sn.map();
                    let here = match placed.get(&oid) {
                        Some(&(epoch, here)) if epoch == map.epoch => here,
                        _ => {
                            let here = drove_placement::locate_vdi(&map, &vdi, oid).contains(&node);
                            placed.insert(oid, (map.epoch, here));
                            here
                        }
                    };
                    let disk = if here {
                        Model::wire_time(bs, model.disk_bytes_per_s)
                    } else {
                        Duration::ZERO
                    };
                    let ready = c
                        .net
                        .sleep_to(c.net.busy(node, model.client_cost + disk, now))
                        .await;
                    let woke = Instant::now();
                    let res = if op.is_write() {
                        gw.write(&vdi, oid, off, data.clone(), false, g).await
                    } else {
                        gw.read(&vdi, oid, off, bs as u32).await.map(|_| ())
                    };
                    now = crate::net::resume(ready, woke);
                    match res {
                        Ok(()) if (from..=end).contains(&Instant::now()) => {
                            done.fetch_add(bs, Ordering::Relaxed);
                        }
                        Ok(()) => {}
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    if opts.warmup_secs > 0 {
        // The traffic of the measured seconds only.
        tokio::time::sleep_until(from).await;
        let _ = c.net.take_traffic();
    }
    for t in tasks {
        let _ = t.await;
    }
    let errs = errors.load(Ordering::Relaxed);
    if errs > 0 {
        anyhow::bail!("{errs} I/O errors during the point");
    }
    let t = c.net.take_traffic();
    let secs = opts.secs as f64;
    let per_client: Vec<f64> = counters
        .iter()
        .map(|n| n.load(Ordering::Relaxed) as f64 / secs / 1e6)
        .collect();
    let client_bytes: u64 = counters.iter().map(|n| n.load(Ordering::Relaxed)).sum();
    Ok((
        per_client,
        Traffic {
            client_bytes,
            peer_sent_bytes: t.bytes,
            peer_received_bytes: t.bytes,
            cross_zone_sent_bytes: t.cross_zone_bytes,
            cross_zone_received_bytes: t.cross_zone_bytes,
            proxy_bytes: None,
            computed_wan_bytes: 0,
        },
    ))
}

/// The object and offset in it of byte `off` of VDI `vdi`.
fn at(vdi: drove_types::VdiId, off: u64) -> (ObjectId, u64) {
    let os = u64::from(OBJECT_SIZE);
    (ObjectId::new(vdi, (off / os) as u32), off % os)
}

/// The report as text: the model, the points and the paper's indexes.
pub fn text(r: &PaperReport) -> String {
    let mut s = String::new();
    let delay_ms = u64::try_from(r.opts.model.zone_delay.as_millis()).unwrap_or(0);
    s.push_str(
        "drove sim paper: drove's gateway, replica and metadata code on a simulated cluster\n",
    );
    s.push_str("Model:\n");
    for line in r.opts.model.describe() {
        s.push_str(&format!("  {line}\n"));
    }
    s.push_str(&format!(
        "  {} s simulated per point{}, {} MiB disks, {} requests in flight per VM, seed {}\n",
        r.opts.secs,
        if r.opts.warmup_secs > 0 {
            format!(" after {} s not measured", r.opts.warmup_secs)
        } else {
            String::new()
        },
        r.opts.disk_mib,
        r.opts.iodepth,
        r.opts.seed
    ));
    s.push_str(match r.opts.meta {
        crate::cluster::MetaMode::Model => {
            "  metadata: drove's state machine applied directly (not openraft), one round trip between zones per command\n\n"
        }
        crate::cluster::MetaMode::Raft => {
            "  metadata: openraft on every node (the metadata service drove runs), over the simulated network\n\n"
        }
    });
    s.push_str("Per-client throughput (MB/s):\n");
    s.push_str(&format!(
        "{:<16} {:<12} {:>4} {:>10} {:>10} {:>12}\n",
        "system",
        "op",
        "X",
        "0 ms",
        format!("{delay_ms} ms"),
        "xzone B/B"
    ));
    for p in r.points.iter().filter(|p| p.delay_ms == 0) {
        let d = r
            .points
            .iter()
            .find(|q| q.system == p.system && q.op == p.op && q.x == p.x && q.delay_ms == delay_ms);
        let xz = d
            .and_then(|q| q.cross_zone_efficiency())
            .map(|v| format!("{v:.2}"))
            .unwrap_or_else(|| "-".into());
        s.push_str(&format!(
            "{:<16} {:<12} {:>4} {:>10.1} {:>10} {:>12}\n",
            p.system.name(),
            p.op.name(),
            p.x,
            p.mean_mbps,
            d.map(|q| format!("{:.1}", q.mean_mbps))
                .unwrap_or_else(|| "-".into()),
            xz
        ));
    }
    s.push_str(&format!(
        "\nLatencyImpactRatio ({delay_ms} ms / 0 ms) and ParallelismImpactRatio (X / 1, with the delay):\n"
    ));
    s.push_str(&format!(
        "{:<16} {:<12} {:>4} {:>8} {:>8}\n",
        "system", "op", "X", "LIR", "PIR"
    ));
    let xs = r.opts.xs();
    for &pol in &r.opts.policies {
        let sys = System::drove(pol);
        for &op in &r.opts.ops {
            for &x in &xs {
                let lir = lookup(&r.indexes, IndexKind::Latency, sys, op, x, delay_ms)
                    .and_then(|i| i.value);
                let pir = lookup(&r.indexes, IndexKind::Parallelism, sys, op, x, delay_ms)
                    .and_then(|i| i.value);
                s.push_str(&format!(
                    "{:<16} {:<12} {:>4} {:>8} {:>8}\n",
                    sys.name(),
                    op.name(),
                    x,
                    fmt_ratio(lir),
                    fmt_ratio(pir)
                ));
            }
        }
    }
    s
}
