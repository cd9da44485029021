//! One measured run: X fio clients at once against one system, with the machine's
//! CPU load and the bytes moved read around it. Also the prefill (every disk written
//! once before reads are measured).
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::baseline::Baseline;
use crate::cluster::DroveCluster;
use crate::config::{Op, PaperConfig, System, DEFAULT_IODEPTH};
use crate::cpu;
use crate::fio::{job_args, parse_fio_json, prefill_args, FioJob};
use crate::metrics::{node_delta, proxy_bytes};
use crate::procs::{wait_all, Cancel, ProcGuard};
use crate::results::{RepeatSample, Traffic};
use crate::toxiproxy::Toxiproxy;

/// Name prefix of drove's WAN proxies.
pub const DROVE_PROXY_PREFIX: &str = "drove-";
/// Name prefix of the baseline's WAN proxies.
pub const BASE_PROXY_PREFIX: &str = "base-";

/// Everything a run needs, held for the whole experiment. Fields drop in order:
/// baseline servers, then the cluster, then toxiproxy.
#[derive(Debug)]
pub struct Rig {
    /// The baseline's qemu-nbd servers.
    pub base: Baseline,
    /// The drove cluster.
    pub cluster: DroveCluster,
    /// The WAN proxies.
    pub toxi: Toxiproxy,
    /// For each drove system: the NBD URI of each client's VDI (through a node of
    /// the client's zone), client 0 first.
    pub drove_uris: BTreeMap<System, Vec<String>>,
    /// Where fio writes its output.
    pub fio_dir: PathBuf,
    /// Each node's routes: peer address of a node in another zone -> its proxy.
    pub routes: Vec<BTreeMap<String, String>>,
}

impl Rig {
    /// Long-lived processes of the experiment: nodes, toxiproxy, qemu-nbd servers.
    pub fn pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.cluster.nodes.iter().map(|n| n.pid).collect();
        v.push(self.toxi.pid());
        v.extend(self.base.pids());
        v
    }
}

struct Spawned {
    guards: Vec<ProcGuard>,
    outs: Vec<(PathBuf, PathBuf)>,
}

fn spawn_fio(dir: &Path, tag: &str, jobs: &[Vec<String>]) -> Result<Spawned> {
    let mut s = Spawned {
        guards: Vec::new(),
        outs: Vec::new(),
    };
    for (i, args) in jobs.iter().enumerate() {
        let out = dir.join(format!("{tag}-c{i}.json"));
        let err = dir.join(format!("{tag}-c{i}.err"));
        let fo = std::fs::File::create(&out)
            .with_context(|| format!("Cannot create {}", out.display()))?;
        let fe = std::fs::File::create(&err)
            .with_context(|| format!("Cannot create {}", err.display()))?;
        let child = Command::new("fio")
            .args(args)
            .stdin(Stdio::null())
            .stdout(fo)
            .stderr(fe)
            .spawn()
            .context("Cannot start fio")?;
        s.guards
            .push(ProcGuard::new(child, format!("fio client {i}")));
        s.outs.push((out, err));
    }
    Ok(s)
}

/// Run `jobs` as parallel fio processes and parse each one's JSON.
fn run_fio(
    dir: &Path,
    tag: &str,
    jobs: &[Vec<String>],
    timeout: Duration,
    cancel: &Cancel,
) -> Result<Vec<FioJob>> {
    let mut s = spawn_fio(dir, tag, jobs)?;
    let statuses = wait_all(&mut s.guards, timeout, cancel)?;
    let mut out = Vec::new();
    for (i, (st, (o, e))) in statuses.iter().zip(&s.outs).enumerate() {
        let text = std::fs::read_to_string(o).unwrap_or_default();
        if !st.success() {
            let err = std::fs::read_to_string(e).unwrap_or_default();
            bail!(
                "fio client {i} ({tag}) failed ({st}): {}{}",
                err.trim(),
                text.trim()
            );
        }
        let job = parse_fio_json(&text)
            .with_context(|| format!("fio client {i} ({tag}), output in {}", o.display()))?;
        let job = job.into_iter().next().context("fio reported no job")?;
        if job.error != 0 {
            bail!("fio client {i} ({tag}) reported error {}", job.error);
        }
        out.push(job);
    }
    Ok(out)
}

/// Write every disk of every system once, sequentially, all clients of one system
/// at once, one system after the other.
pub fn prefill(rig: &mut Rig, cfg: &PaperConfig, cancel: &Cancel) -> Result<()> {
    let timeout = Duration::from_secs(3600);
    for (system, uris) in &rig.drove_uris {
        let jobs: Vec<Vec<String>> = uris
            .iter()
            .enumerate()
            .map(|(i, u)| prefill_args(&format!("c{i}"), u, cfg.size, DEFAULT_IODEPTH))
            .collect();
        let tag = format!("prefill-{}", system.name());
        run_fio(&rig.fio_dir, &tag, &jobs, timeout, cancel)?;
    }
    let jobs: Vec<Vec<String>> = rig
        .base
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| prefill_args(&format!("c{i}"), &c.uri, cfg.size, DEFAULT_IODEPTH))
        .collect();
    run_fio(&rig.fio_dir, "prefill-baseline", &jobs, timeout, cancel)?;
    Ok(())
}

/// Which point a run belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PointKey {
    /// System.
    pub system: System,
    /// Operation.
    pub op: Op,
    /// Clients at once.
    pub x: usize,
    /// One-way delay between zones, ms.
    pub delay_ms: u64,
}

/// One repeat (`rep`, 0-based) of one point: X clients of the system run the
/// operation at once.
pub fn measure(
    rig: &mut Rig,
    cfg: &PaperConfig,
    key: PointKey,
    rep: usize,
    cancel: &Cancel,
) -> Result<(RepeatSample, Traffic)> {
    let PointKey {
        system,
        op,
        x,
        delay_ms,
    } = key;
    let uris: Vec<String> = match system {
        System::Drove | System::DroveZoneSync => rig
            .drove_uris
            .get(&system)
            .map(|u| u.iter().take(x).cloned().collect())
            .unwrap_or_default(),
        System::Baseline => {
            rig.base.check_running()?;
            rig.base
                .clients
                .iter()
                .take(x)
                .map(|c| c.uri.clone())
                .collect()
        }
    };
    if uris.len() != x {
        bail!(
            "Only {} {} disks prepared for X={x}",
            uris.len(),
            system.name()
        );
    }
    let nodes_before = match system {
        System::Drove | System::DroveZoneSync => Some(rig.cluster.scrape()?),
        System::Baseline => None,
    };
    let px_before = match system {
        System::Drove | System::DroveZoneSync => 0,
        System::Baseline => proxy_bytes(&rig.toxi.metrics()?, BASE_PROXY_PREFIX),
    };
    let jobs: Vec<Vec<String>> = uris
        .iter()
        .enumerate()
        .map(|(i, u)| {
            job_args(
                &format!("c{i}"),
                u,
                op,
                cfg.size,
                cfg.runtime_secs,
                DEFAULT_IODEPTH,
            )
        })
        .collect();
    let tag = format!("{}-{}-x{x}-d{delay_ms}-r{rep}", system.name(), op.name());
    let pids = rig.pids();
    let cpu0 = cpu::sample()?;
    let own0 = cpu::experiment_ticks(&pids);
    // fio stops on its own after the runtime; the margin covers start-up and a slow
    // first connection over the WAN.
    let timeout = Duration::from_secs(cfg.runtime_secs + 120);
    let results = run_fio(&rig.fio_dir, &tag, &jobs, timeout, cancel)?;
    let cpu1 = cpu::sample()?;
    let own1 = cpu::experiment_ticks(&pids);
    let mut traffic = Traffic::default();
    match nodes_before {
        Some(before) => {
            let after = rig.cluster.scrape()?;
            let d = node_delta(&rig.cluster.id_zones(), &before, &after);
            traffic.client_bytes = if op.is_write() {
                d.nbd_write
            } else {
                d.nbd_read
            };
            traffic.peer_sent_bytes = d.peer_sent;
            traffic.peer_received_bytes = d.peer_received;
            traffic.cross_zone_sent_bytes = d.cross_sent;
            traffic.cross_zone_received_bytes = d.cross_received;
        }
        None => {
            traffic.client_bytes = results.iter().map(|j| j.io_bytes(op)).sum();
            traffic.computed_wan_bytes = results
                .iter()
                .zip(&rig.base.clients)
                .filter(|(_, c)| c.zone != 1)
                .map(|(j, _)| j.io_bytes(op))
                .sum();
            let after = settled_proxy_bytes(
                &mut rig.toxi,
                BASE_PROXY_PREFIX,
                px_before + traffic.computed_wan_bytes,
            )?;
            traffic.proxy_bytes = Some(after.saturating_sub(px_before));
        }
    }
    let sample = RepeatSample {
        per_client_mbps: results.iter().map(|j| j.mbps(op)).collect(),
        cpu_busy: cpu::busy_fraction(cpu0, cpu1).unwrap_or(0.0),
        own_cpu: crate::index::ratio(
            own1.saturating_sub(own0) as f64,
            cpu1.total.saturating_sub(cpu0.total) as f64,
        )
        .unwrap_or(0.0)
        .min(1.0),
    };
    Ok((sample, traffic))
}

/// toxiproxy's byte count of proxies named `prefix*` once the connections that
/// just closed are counted: it adds a connection's bytes when the connection ends,
/// a moment after the client exits. Waits until the count reaches `at_least` and
/// stops moving (at most 3 s).
pub fn settled_proxy_bytes(toxi: &mut Toxiproxy, prefix: &str, at_least: u64) -> Result<u64> {
    let end = Instant::now() + Duration::from_secs(3);
    let mut last = proxy_bytes(&toxi.metrics()?, prefix);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = proxy_bytes(&toxi.metrics()?, prefix);
        if (now == last && now >= at_least) || Instant::now() > end {
            return Ok(now);
        }
        last = now;
    }
}

/// Add two traffic counts.
pub fn add_traffic(a: &mut Traffic, b: &Traffic) {
    a.client_bytes += b.client_bytes;
    a.peer_sent_bytes += b.peer_sent_bytes;
    a.peer_received_bytes += b.peer_received_bytes;
    a.cross_zone_sent_bytes += b.cross_zone_sent_bytes;
    a.cross_zone_received_bytes += b.cross_zone_received_bytes;
    a.proxy_bytes = match (a.proxy_bytes, b.proxy_bytes) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
    };
    a.computed_wan_bytes += b.computed_wan_bytes;
}
