//! `drove sim`: the deterministic simulator (crates/sim). drove's own gateway,
//! replica side, recovery and metadata state machine run on a simulated network,
//! clock and disks, one thread and one seed: the same seed prints the same output,
//! byte for byte. Each run uses its own runtime (tokio's paused clock) on a thread
//! of its own, not the command's runtime.
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use drove_paperbench::config::{parse_duration_ms, parse_ops, parse_parallel, parse_policies};
use drove_sim::cluster::MetaMode;
use drove_sim::faults::{FaultKind, FaultOpts};
use drove_sim::paper::PaperOpts;
use std::io::Write;
use std::time::Duration;

use crate::client::{print_json, Ctx};

#[derive(Subcommand)]
pub enum SimCmd {
    /// Seeded fault runs: clients write sync and zone-sync VDIs while nodes crash,
    /// zones are cut off or lost and disk blocks flip; after healing, checks that
    /// no acknowledged write was lost, no read returned data never written, every
    /// object has identical copies and one writer held each VDI. A failing seed is
    /// printed; `--seed S` replays it exactly. Exit status 1 when a seed failed.
    Faults(FaultArgs),
    /// The paper's experiment at its scale (4 zones x 22 nodes, X = 1, 10, 20, 44,
    /// 10 ms between zones) on the simulator, for the sync and zone-sync policies:
    /// per-client throughput, LatencyImpactRatio, ParallelismImpactRatio and
    /// cross-zone bytes, with the model's parameters.
    Paper(PaperSimArgs),
    /// The time to recover from the loss of one datacenter: VMs fill their VDIs,
    /// every node of one zone crashes for good (by default the zone holding the
    /// metadata leader) while the VMs of the other zones keep writing, and the run
    /// measures their longest write pause, when the lost nodes are marked down and
    /// when the nodes left are clean again, with the epochs and `List` requests it
    /// took.
    /// `--per-node-verdicts` replays the failure detector as it was before
    /// `JudgeNodes` (one epoch per node), for the comparison.
    DcLoss(DcLossArgs),
}

#[derive(Args)]
pub struct DcLossArgs {
    /// Zones ("datacenters").
    #[arg(long, default_value_t = 4)]
    zones: usize,
    /// The zone lost (z1, z2, ...) [default: with openraft, the zone holding the
    /// metadata leader at the loss; in the model, the last zone].
    #[arg(long)]
    zone: Option<String>,
    /// The metadata: `raft` (a real metadata service, openraft included, on every
    /// node, over the simulated network) or `model` (one state machine for the
    /// cluster, applied after a modelled commit time).
    #[arg(long, default_value = "raft")]
    meta: String,
    /// The seed of every random choice drove's code makes (openraft's elections).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// drove nodes per zone.
    #[arg(long, default_value_t = 22)]
    nodes_per_zone: usize,
    /// VDIs, spread over the zones.
    #[arg(long, default_value_t = 44)]
    vdis: usize,
    /// Each VDI's size, MiB (all written before the loss).
    #[arg(long, default_value_t = 16)]
    disk_mib: u64,
    /// One-way delay between zones.
    #[arg(long, default_value = "10ms")]
    delay: String,
    /// The failure detector sends one command (one epoch) per node, as before.
    #[arg(long)]
    per_node_verdicts: bool,
    /// Once the nodes left are clean, bring the lost zone back after this long
    /// (e.g. 60s): its nodes restart on the disks they had and catch up; the run
    /// then also reports that return.
    #[arg(long)]
    return_after: Option<String>,
}

#[derive(Args)]
pub struct FaultArgs {
    /// The (first) seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seeds to run, from --seed on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Nodes in all (a multiple of --zones).
    #[arg(long, default_value_t = 9)]
    nodes: usize,
    /// Zones ("datacenters").
    #[arg(long, default_value_t = 3)]
    zones: usize,
    /// VDIs, each with one client; every other one is zone-sync.
    #[arg(long, default_value_t = 4)]
    vdis: usize,
    /// Simulated time the clients run, e.g. 40s.
    #[arg(long, default_value = "40s")]
    time: String,
    /// Threads running seeds at once [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// The kinds of fault, comma-separated: crash, cut, lose, flip, power, eio,
    /// fsync-fail, enospc, slow-disk.
    #[arg(
        long,
        default_value = "crash,cut,lose,flip,power,eio,fsync-fail,enospc,slow-disk"
    )]
    faults: String,
    /// The metadata: `model` (one state machine for the cluster, applied after a
    /// modelled commit time; the seeds named in the docs and tests replay in it)
    /// or `raft` (a real metadata service, openraft included, on every node, over
    /// the simulated network, its log and vote on the node's simulated disk, which
    /// a power loss hits too).
    #[arg(long, default_value = "model")]
    meta: String,
}

#[derive(Args)]
pub struct PaperSimArgs {
    /// Zones ("datacenters").
    #[arg(long, default_value_t = 4)]
    zones: usize,
    /// drove nodes per zone.
    #[arg(long, default_value_t = 22)]
    nodes_per_zone: usize,
    /// Clients at once, comma-separated; 1 is always added.
    #[arg(long, default_value = "1,10,20,44")]
    parallel: String,
    /// One-way delay between zones.
    #[arg(long, default_value = "10ms")]
    delay: String,
    /// One-way delay inside a zone, microseconds.
    #[arg(long, default_value_t = 100)]
    local_delay_us: u64,
    /// Simulated time each point measures, e.g. 60s.
    #[arg(long, default_value = "10s")]
    time: String,
    /// Simulated time each point's clients run before it measures (the zone-sync
    /// lag fills within the VDI's lag bound, 5 s), e.g. 0s.
    #[arg(long, default_value = "5s")]
    warmup: String,
    /// Write policies, comma-separated: sync, zone-sync.
    #[arg(long, default_value = "sync,zone-sync")]
    policy: String,
    /// Operations, comma-separated: block-write, block-read, small-write, small-read.
    #[arg(long, default_value = "block-write,block-read,small-write,small-read")]
    ops: String,
    /// Each node's link, MB/s per direction.
    #[arg(long, default_value_t = 1250)]
    link_mb_s: u64,
    /// Each node's disk, MB/s.
    #[arg(long, default_value_t = 1000)]
    disk_mb_s: u64,
    /// Cost of one request served for a peer, microseconds (besides its bytes).
    #[arg(long, default_value_t = 20)]
    serve_us: u64,
    /// Cost of one client operation at its node, microseconds.
    #[arg(long, default_value_t = 20)]
    client_us: u64,
    /// Each VM's disk, MiB.
    #[arg(long, default_value_t = 16)]
    disk_mib: u64,
    /// The seed of the random offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads running points at once [default: the machine's cores]. Each point
    /// is its own simulated cluster and clock: the figures are the same on any
    /// number of threads.
    #[arg(long)]
    threads: Option<usize>,
    /// The metadata: `model` (drove's state machine applied after a modelled
    /// commit time, one round trip between zones per command) or `raft` (the
    /// metadata service drove runs, openraft included, on every node).
    #[arg(long, default_value = "model")]
    meta: String,
}

/// Log lines stamped with the simulated time.
struct SimClock;

impl tracing_subscriber::fmt::time::FormatTime for SimClock {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match drove_sim::sim_time() {
            Some(t) => write!(w, "{:>10.3}s", t.as_secs_f64()),
            None => write!(w, "{:>11}", "-"),
        }
    }
}

pub async fn run(cmd: SimCmd, ctx: &Ctx) -> Result<()> {
    let json = ctx.json;
    // DROVE_SIM_LOG=drove_replica=debug: drove's own logs of the simulated nodes,
    // on stderr, stamped with the simulated time (stdout stays the report).
    if let Ok(filter) = std::env::var("DROVE_SIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_timer(SimClock)
            .try_init();
    }
    // A simulation is CPU work on threads of its own.
    let work = std::thread::spawn(move || match cmd {
        SimCmd::Faults(a) => faults(a, json),
        SimCmd::Paper(a) => paper(a, json),
        SimCmd::DcLoss(a) => dc_loss(a, json),
    });
    tokio::task::spawn_blocking(move || work.join())
        .await
        .context("The simulation's thread was lost")?
        .map_err(|_| anyhow::anyhow!("The simulation panicked"))?
}

fn secs(s: &str, what: &str) -> Result<u64> {
    let ms = parse_duration_ms(s, 1000).with_context(|| format!("Bad {what} '{s}'"))?;
    if ms < 1000 || !ms.is_multiple_of(1000) {
        bail!("Bad {what} '{s}': give whole seconds, at least 1s (e.g. 40s)");
    }
    Ok(ms / 1000)
}

fn parse_kinds(s: &str) -> Result<Vec<FaultKind>> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some(k) = FaultKind::parse(part) else {
            bail!(
                "Unknown fault '{part}' in --faults: use crash, cut, lose, flip, power, eio, fsync-fail, enospc and slow-disk"
            );
        };
        if !v.contains(&k) {
            v.push(k);
        }
    }
    Ok(v)
}

fn faults(a: FaultArgs, json: bool) -> Result<()> {
    if a.zones == 0 || a.nodes == 0 || !a.nodes.is_multiple_of(a.zones) {
        bail!(
            "--nodes {} must be a non-zero multiple of --zones {}",
            a.nodes,
            a.zones
        );
    }
    if a.nodes < 3 || a.nodes > 256 {
        bail!("--nodes {}: give 3 to 256 nodes", a.nodes);
    }
    if a.vdis == 0 || a.vdis > 64 {
        bail!("--vdis {}: give 1 to 64", a.vdis);
    }
    if a.seeds == 0 {
        bail!("--seeds 0: give at least one seed");
    }
    let t = secs(&a.time, "--time")?;
    if !(10..=3600).contains(&t) {
        bail!("--time {}: give 10s to 3600s", a.time);
    }
    let Some(meta) = MetaMode::parse(&a.meta) else {
        bail!("Unknown metadata '{}' in --meta: use model or raft", a.meta);
    };
    let opts = FaultOpts {
        meta,
        zones: a.zones,
        nodes_per_zone: a.nodes / a.zones,
        vdis: a.vdis,
        secs: t,
        sabotage: false,
        sabotage_flush: false,
        kinds: parse_kinds(&a.faults)?,
    };
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let done = std::sync::atomic::AtomicU64::new(0);
    let total = a.seeds;
    let progress = |r: &drove_sim::SeedReport| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if total > 1 && (n.is_multiple_of(50) || n == total || !r.passed()) {
            let _ = writeln!(
                std::io::stderr(),
                "{n}/{total} seeds run{}",
                if r.passed() {
                    String::new()
                } else {
                    format!(" (seed {} failed)", r.seed)
                }
            );
        }
    };
    let reports = drove_sim::run_seeds(a.seed, a.seeds, &opts, threads, &progress)?;
    let failed: Vec<u64> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.seed)
        .collect();
    if json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            opts: &'a FaultOpts,
            seeds: usize,
            failed: &'a [u64],
            reports: &'a [drove_sim::SeedReport],
        }
        print_json(&Out {
            opts: &opts,
            seeds: reports.len(),
            failed: &failed,
            reports: &reports,
        })?;
    } else {
        let mut out = std::io::stdout().lock();
        for r in &reports {
            if reports.len() == 1 || !r.passed() {
                writeln!(
                    out,
                    "seed {}: {} ({} writes acknowledged, {} failed, {} reads checked, {} epochs, {} copies failing their checksums found by the scrubs and {} repaired, {:.1} s simulated)",
                    r.seed,
                    if r.passed() { "passed" } else { "FAILED" },
                    r.acked,
                    r.failed,
                    r.reads,
                    r.epochs,
                    r.scrub_corrupt,
                    r.scrub_repaired,
                    r.sim_secs
                )?;
                for f in &r.faults {
                    writeln!(out, "  fault: {f}")?;
                }
                for v in &r.violations {
                    writeln!(out, "  broken: {v}")?;
                }
            }
        }
        let acked: u64 = reports.iter().map(|r| r.acked).sum();
        let faults: usize = reports.iter().map(|r| r.faults.len()).sum();
        let repaired: u64 = reports.iter().map(|r| r.scrub_repaired).sum();
        writeln!(
            out,
            "{} seeds from {} ({} nodes in {} zones, {} VDIs, {} s each): {} passed, {} failed; {} faults injected, {} writes acknowledged, {} copies repaired by scrubs",
            reports.len(),
            a.seed,
            a.nodes,
            a.zones,
            a.vdis,
            t,
            reports.len() - failed.len(),
            failed.len(),
            faults,
            acked,
            repaired
        )?;
    }
    if let Some(first) = failed.first() {
        bail!(
            "{} of {} seeds broke an invariant; replay one with `drove sim faults --seed {first} --nodes {} --zones {} --vdis {} --time {} --faults {} --meta {}`",
            failed.len(),
            reports.len(),
            a.nodes,
            a.zones,
            a.vdis,
            a.time,
            a.faults,
            a.meta
        );
    }
    Ok(())
}

fn dc_loss(a: DcLossArgs, json: bool) -> Result<()> {
    if a.zones < 2 || a.nodes_per_zone == 0 || (a.zones - 1) * a.nodes_per_zone < 3 {
        bail!("Give at least 2 zones and 3 nodes outside the zone lost");
    }
    if a.zones * a.nodes_per_zone > 1024 {
        bail!("At most 1024 nodes");
    }
    if a.vdis == 0 || a.vdis > 1024 {
        bail!("--vdis {}: give 1 to 1024", a.vdis);
    }
    if a.disk_mib == 0 || a.disk_mib > 1024 {
        bail!("--disk-mib {}: give 1 to 1024", a.disk_mib);
    }
    let delay =
        parse_duration_ms(&a.delay, 1).with_context(|| format!("Bad --delay '{}'", a.delay))?;
    let Some(meta) = MetaMode::parse(&a.meta) else {
        bail!("Unknown metadata '{}' in --meta: use raft or model", a.meta);
    };
    if let Some(z) = &a.zone {
        if let Err(e) = drove_sim::dcloss::zone_index(z, a.zones) {
            bail!("{e} (--zone)");
        }
    }
    let opts = drove_sim::dcloss::DcLossOpts {
        meta,
        zone: a.zone.clone(),
        seed: a.seed,
        model: drove_sim::Model {
            zones: a.zones,
            nodes_per_zone: a.nodes_per_zone,
            zone_delay: Duration::from_millis(delay),
            batch_verdicts: !a.per_node_verdicts,
            ..drove_sim::Model::default()
        },
        vdis: a.vdis,
        disk_mib: a.disk_mib,
        return_after: a
            .return_after
            .as_deref()
            .map(|t| secs(t, "--return-after"))
            .transpose()?
            .map(Duration::from_secs),
    };
    let started = std::time::Instant::now();
    let r = drove_sim::dcloss::run(&opts)?;
    let _ = writeln!(
        std::io::stderr(),
        "{:.1} s of wall time",
        started.elapsed().as_secs_f64()
    );
    if json {
        print_json(&r)?;
    } else {
        print!("{}", drove_sim::dcloss::text(&r));
    }
    if !r.finished || r.returned.as_ref().is_some_and(|b| !b.finished) {
        bail!("Recovery did not finish within 600 simulated seconds");
    }
    Ok(())
}

fn paper(a: PaperSimArgs, json: bool) -> Result<()> {
    if a.zones == 0 || a.nodes_per_zone == 0 || a.zones * a.nodes_per_zone < 3 {
        bail!("Give at least 3 nodes (--zones x --nodes-per-zone)");
    }
    if a.zones * a.nodes_per_zone > 1024 {
        bail!("At most 1024 nodes");
    }
    let delay =
        parse_duration_ms(&a.delay, 1).with_context(|| format!("Bad --delay '{}'", a.delay))?;
    let t = secs(&a.time, "--time")?;
    // No warm-up (0s, as before the option) is allowed; else whole seconds.
    let warmup = match parse_duration_ms(&a.warmup, 1000) {
        Ok(0) => 0,
        _ => secs(&a.warmup, "--warmup")?,
    };
    if a.disk_mib == 0 || a.disk_mib > 4096 {
        bail!("--disk-mib {}: give 1 to 4096", a.disk_mib);
    }
    if a.link_mb_s == 0 || a.disk_mb_s == 0 {
        bail!("--link-mb-s and --disk-mb-s must be above 0");
    }
    let parallel = parse_parallel(&a.parallel)?;
    let Some(meta) = MetaMode::parse(&a.meta) else {
        bail!("Unknown metadata '{}' in --meta: use model or raft", a.meta);
    };
    let model = drove_sim::Model {
        zones: a.zones,
        nodes_per_zone: a.nodes_per_zone,
        zone_delay: Duration::from_millis(delay),
        local_delay: Duration::from_micros(a.local_delay_us),
        nic_bytes_per_s: a.link_mb_s * 1_000_000,
        disk_bytes_per_s: a.disk_mb_s * 1_000_000,
        serve_cost: Duration::from_micros(a.serve_us),
        client_cost: Duration::from_micros(a.client_us),
        ..drove_sim::Model::default()
    };
    let opts = PaperOpts {
        model,
        parallel,
        secs: t,
        warmup_secs: warmup,
        disk_mib: a.disk_mib,
        policies: parse_policies(&a.policy)?,
        ops: parse_ops(&a.ops)?,
        seed: a.seed,
        meta,
        ..PaperOpts::default()
    };
    let started = std::time::Instant::now();
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        bail!("--threads 0: give at least 1");
    }
    let report = drove_sim::paper::run_on(&opts, threads, &|p, wall| {
        let _ = writeln!(
            std::io::stderr(),
            "{} {} X={} delay={} ms: {:.1} MB/s per client ({:.1} s of wall time)",
            p.system.name(),
            p.op.name(),
            p.x,
            p.delay_ms,
            p.mean_mbps,
            wall.as_secs_f64()
        );
    })?;
    let _ = writeln!(
        std::io::stderr(),
        "{} points in {:.1} s of wall time",
        report.points.len(),
        started.elapsed().as_secs_f64()
    );
    if json {
        print_json(&report)
    } else {
        print!("{}", drove_sim::paper::text(&report));
        Ok(())
    }
}
