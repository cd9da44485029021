//! The whole experiment, in order: check the tools, start the WAN proxy and the drove
//! cluster, lay out the WAN (routes files before any I/O), create one disk per
//! client on every system (one drove VDI per client and write policy, in the one
//! cluster), prefill them, check that cross-zone traffic goes through the proxies,
//! then run [`schedule`]: for each delay (0, then the delay after the toxics are
//! added and a round trip proves them) every (X, operation) point, repeats
//! interleaved across the systems (drove with each policy, then the baseline).
//! Everything started is stopped on every path (guards), then results.csv,
//! indexes.csv, results.md and the charts are written.
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::baseline::Baseline;
use crate::charts;
use crate::cluster::DroveCluster;
use crate::config::PaperConfig;
use crate::cpu;
use crate::index::compute_indexes;
use crate::measure::{
    add_traffic, measure, prefill, settled_proxy_bytes, PointKey, Rig, DROVE_PROXY_PREFIX,
};
use crate::metrics::node_delta;
use crate::procs::{on_path, Cancel};
use crate::progress::Progress;
use crate::report;
use crate::results::{
    indexes_csv, points_csv, write_text, DelayCheck, PointResult, RepeatSample, Report, Traffic,
};
use crate::sockets;
use crate::toxiproxy::{self, Toxiproxy, WanProxyKind};
use crate::wan::{client_node, cross_zone_pairs, http_rtt, nbd_rtt, require_delay};

/// Name of the proxy used for the delay check (to node 1's admin port).
const CHECK_PROXY: &str = "check-admin";

/// What is missing to run the experiment with `wan_proxy` (empty when everything is
/// there).
pub fn missing_tools(wan_proxy: WanProxyKind) -> Vec<String> {
    let mut m = Vec::new();
    if !on_path("fio") {
        m.push("fio (apt-get install fio)".to_string());
    }
    if !on_path("qemu-nbd") {
        m.push("qemu-nbd (apt-get install qemu-utils)".to_string());
    }
    if wan_proxy == WanProxyKind::Toxiproxy && toxiproxy::find_binary().is_none() {
        m.push(format!("toxiproxy ({})", toxiproxy::INSTALL_HINT));
    }
    m
}

/// Run the experiment described by `cfg`; `cancel` stops it (everything started
/// is stopped before this returns).
pub fn run(cfg: &PaperConfig, cancel: &Cancel) -> Result<Report> {
    cfg.validate()?;
    let missing = missing_tools(cfg.wan_proxy);
    if !missing.is_empty() {
        bail!("Missing tools: {}", missing.join("; "));
    }
    if !cfg.drove_bin.is_file() {
        bail!("No drove binary at {}", cfg.drove_bin.display());
    }
    std::fs::create_dir_all(&cfg.out)
        .with_context(|| format!("Cannot create {}", cfg.out.display()))?;
    check_room(cfg)?;
    let work = cfg.out.join(format!("work-{}", std::process::id()));
    std::fs::create_dir_all(work.join("fio"))
        .with_context(|| format!("Cannot create {}", work.display()))?;
    let res = run_in(cfg, &work, cancel);
    match &res {
        Ok(_) => {
            let _ = std::fs::remove_dir_all(&work);
        }
        Err(_) => {
            // Keep the logs to explain the failure; drop the disks (gigabytes).
            prune_keep_logs(&work);
            say!("logs of the failed run are in {}", work.display());
            for (file, lines) in warnings_in_logs(&work, WARNINGS_SHOWN) {
                say!("last warnings in {}:", file.display());
                for l in lines {
                    say!("  {l}");
                }
            }
        }
    }
    res
}

/// Refuse to start without room for the disks and a quarter more (a node marked
/// down has its share copied elsewhere while its own copies stay, and every node
/// is on this host's one disk) plus 1 GiB: a full disk 20 minutes in fails the run
/// with EIO, as it did on 2026-11-24.
fn check_room(cfg: &PaperConfig) -> Result<()> {
    const GIB: u64 = 1 << 30;
    let need = cfg.disk_bytes() + cfg.disk_bytes() / 4 + GIB;
    // What `df` shows as available (an unprivileged writer's free space).
    let Some(free) = drove_objstore::disk_space(&cfg.out).map(|d| d.free) else {
        say!(
            "warning: cannot tell the free space of {}",
            cfg.out.display()
        );
        return Ok(());
    };
    if free < need {
        bail!(
            "Not enough disk space in {}: this run needs about {:.1} GiB ({} disks of {} MiB on {} system(s),              drove's {} times) and has {:.1} GiB free; use a smaller --size or --parallel, or free space",
            cfg.out.display(),
            need as f64 / GIB as f64,
            cfg.clients(),
            cfg.size >> 20,
            cfg.policies.len() + 1,
            cfg.copies,
            free as f64 / GIB as f64
        );
    }
    Ok(())
}

/// Warning and error lines shown per log file when a run fails.
const WARNINGS_SHOWN: usize = 12;

/// The last `most` warning or error lines of every `.log` file under `dir` that
/// has any, files in path order: what a failed run's output shows, so the cause is
/// visible where the run was started (a test's temporary directory is gone later).
fn warnings_in_logs(dir: &Path, most: usize) -> Vec<(PathBuf, Vec<String>)> {
    let mut files = Vec::new();
    log_files(dir, &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let hits: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        if hits.is_empty() {
            continue;
        }
        let from = hits.len().saturating_sub(most);
        out.push((f, hits[from..].iter().map(|l| l.to_string()).collect()));
    }
    out
}

fn log_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            log_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "log") {
            out.push(p);
        }
    }
}

fn prune_keep_logs(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            prune_keep_logs(&p);
            let _ = std::fs::remove_dir(&p);
        } else if !p.extension().is_some_and(|x| x == "log" || x == "err") {
            let _ = std::fs::remove_file(&p);
        }
    }
}

fn start_rig(
    cfg: &PaperConfig,
    work: &Path,
    cancel: &Cancel,
) -> Result<(Rig, Vec<String>, String)> {
    let toxi = Toxiproxy::start_kind(
        cfg.wan_proxy,
        &cfg.drove_bin,
        &work.join("wan-proxy.log"),
        cancel,
    )?;
    say!(
        "starting drove: {} zones x {} nodes, copies {}, write policies {}; WAN proxy ({}) API at {}",
        cfg.zones,
        cfg.nodes_per_zone,
        cfg.copies,
        cfg.policies_text(),
        cfg.wan_proxy.name(),
        toxi.api()
    );
    let cluster = DroveCluster::start(
        &cfg.drove_bin,
        &work.join("cluster"),
        cfg.zones,
        cfg.nodes_per_zone,
        cfg.copies,
    )?;
    if let Some(secs) = cfg.down_after_secs {
        cluster.set_down_after(secs)?;
    }
    cancel.check()?;
    // The WAN: one proxy per ordered cross-zone pair; routes written before any I/O
    // because nodes dial peers lazily and keep the connection.
    let zones = cluster.zones();
    let mut proxies = Vec::new();
    let mut routes = vec![BTreeMap::new(); cluster.nodes.len()];
    for (a, b) in cross_zone_pairs(&zones) {
        let (na, nb) = (&cluster.nodes[a], &cluster.nodes[b]);
        let name = format!("{DROVE_PROXY_PREFIX}{}-{}", na.id, nb.id);
        let listen = toxi.create_proxy(&name, &nb.peer)?;
        routes[a].insert(nb.peer.clone(), listen);
        proxies.push(name);
    }
    for (i, r) in routes.iter().enumerate() {
        cluster.write_routes(i, r)?;
    }
    // A node looks at its routes file every half second and only then drops the
    // connections it dialled before (at start-up nodes already talk to each other):
    // wait for that, or a short prefill would still ride a straight connection.
    wait_for_routes(&cluster, &routes, cancel)?;
    let admin0 = cluster
        .nodes
        .first()
        .map(|n| n.admin.clone())
        .unwrap_or_default();
    let check_listen = toxi.create_proxy(CHECK_PROXY, &admin0)?;
    let clients = cfg.clients();
    let mut drove_uris = BTreeMap::new();
    for system in cfg.drove_systems() {
        let policy = system
            .policy()
            .ok_or_else(|| anyhow!("{} is not a drove system", system.name()))?;
        let mut uris = Vec::new();
        for i in 0..clients {
            cancel.check()?;
            let name = system
                .vdi_name(i)
                .ok_or_else(|| anyhow!("{} has no VDIs", system.name()))?;
            cluster.create_vdi(&name, cfg.size, cfg.copies, policy)?;
            let node = client_node(i, cfg.zones, &zones)
                .ok_or_else(|| anyhow!("Zone of client {i} has no node"))?;
            uris.push(cluster.unix_uri(node, &name)?);
        }
        drove_uris.insert(system, uris);
    }
    say!("starting the baseline: {clients} qemu-nbd disk(s) in zone 1");
    let base = Baseline::start(
        &work.join("baseline"),
        clients,
        cfg.zones,
        cfg.size,
        &toxi,
        cancel,
    )?;
    proxies.extend(
        base.clients
            .iter()
            .filter_map(|c| c.proxy.as_ref().map(|p| p.0.clone())),
    );
    proxies.push(CHECK_PROXY.to_string());
    let rig = Rig {
        base,
        cluster,
        toxi,
        drove_uris,
        fio_dir: work.join("fio"),
        routes,
    };
    Ok((rig, proxies, check_listen))
}

/// Connections each node holds (to its proxies, straight to nodes of other zones).
fn route_connections(
    cluster: &DroveCluster,
    routes: &[BTreeMap<String, String>],
) -> Result<(usize, usize)> {
    let port_of = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
    };
    let (mut via, mut direct) = (0, 0);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let routes = routes.get(i).cloned().unwrap_or_default();
        let proxy_ports: HashSet<u16> = routes.values().filter_map(|a| port_of(a)).collect();
        let direct_ports: HashSet<u16> = routes.keys().filter_map(|a| port_of(a)).collect();
        let conns = sockets::connections_of(node.pid)
            .with_context(|| format!("Cannot list the connections of node {}", node.id))?;
        let (v, d) = sockets::classify(&conns, &proxy_ports, &direct_ports);
        via += v;
        direct += d;
    }
    Ok((via, direct))
}

/// Wait (up to 20 s) until no node holds a straight connection to another zone:
/// the nodes dropped those dialled before their routes file was written.
fn wait_for_routes(
    cluster: &DroveCluster,
    routes: &[BTreeMap<String, String>],
    cancel: &Cancel,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        cancel.check()?;
        let (_, direct) = route_connections(cluster, routes)?;
        if direct == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "The nodes still hold {direct} straight connection(s) to other zones 20 s \
                 after their routes file was written (peer-routes.json not read?)"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prefill, then prove that every node reaches the other zones through its proxies:
/// after the prefill each node holds connections to its proxies and none straight
/// to a node of another zone.
fn prefill_and_check_routes(
    rig: &mut Rig,
    cfg: &PaperConfig,
    cancel: &Cancel,
    dc: &mut DelayCheck,
) -> Result<()> {
    say!(
        "prefilling {} disk(s) of {} on each of {} system(s)",
        cfg.clients(),
        drove_types::format_size(cfg.size),
        cfg.systems().len()
    );
    prefill(rig, cfg, cancel)?;
    let (via, direct) = route_connections(&rig.cluster, &rig.routes)?;
    dc.proxied_connections += via;
    dc.direct_cross_zone_connections += direct;
    if dc.direct_cross_zone_connections > 0 || dc.proxied_connections == 0 {
        bail!(
            "Cross-zone peer traffic does not go through the WAN proxies: after the prefill the \
             nodes hold {} connection(s) to their proxies and {} straight to nodes of other \
             zones (peer-routes.json not in effect?)",
            dc.proxied_connections,
            dc.direct_cross_zone_connections
        );
    }
    Ok(())
}

/// Stop everything; before that, read the whole run's cross-zone bytes from the
/// nodes and, once the cluster stopped (its connections closed), from toxiproxy.
fn stop_rig(mut rig: Rig, dc: &mut DelayCheck) -> Result<()> {
    rig.base.stop();
    let counters = rig.cluster.scrape()?;
    let zeros = vec![Default::default(); counters.len()];
    let d = node_delta(&rig.cluster.id_zones(), &zeros, &counters);
    dc.run_cross_zone_bytes = d.cross_sent + d.cross_received;
    rig.cluster.stop();
    dc.run_proxy_bytes = settled_proxy_bytes(
        &mut rig.toxi,
        DROVE_PROXY_PREFIX,
        dc.run_cross_zone_bytes / 2,
    )?;
    rig.toxi.stop();
    Ok(())
}

/// One measured run: repeat `rep` (0-based) of point number `point` (1-based, as
/// the progress line counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The point's number, 1 to [`PaperConfig::points`].
    pub point: usize,
    /// What the run measures.
    pub key: PointKey,
    /// Which repeat of the point.
    pub rep: usize,
}

/// Every run of the experiment in the order they happen: the delays in turn (no
/// delay first), then X, then the operations (each read after its write); a
/// point's repeats in turn, each repeat running every system one after the other
/// (drove with each policy, then the baseline) so that slow drifts of the machine
/// touch them alike.
pub fn schedule(cfg: &PaperConfig) -> Vec<Run> {
    let systems = cfg.systems();
    let mut v = Vec::new();
    let mut first_point = 1;
    for delay_ms in cfg.delays() {
        for &x in &cfg.parallel {
            for &op in &cfg.ops {
                for rep in 0..cfg.repeat {
                    for (si, &system) in systems.iter().enumerate() {
                        let key = PointKey {
                            system,
                            op,
                            x,
                            delay_ms,
                        };
                        v.push(Run {
                            point: first_point + si,
                            key,
                            rep,
                        });
                    }
                }
                first_point += systems.len();
            }
        }
    }
    v
}

/// Put the latency toxics on every proxy and prove them with real round trips
/// (to a node's admin port, and to a baseline server if a client is remote).
fn add_delay(
    rig: &mut Rig,
    proxies: &[String],
    check_listen: &str,
    delay: u64,
    dc: &mut DelayCheck,
) -> Result<()> {
    for p in proxies {
        rig.toxi.add_latency(p, delay)?;
    }
    let rtt = http_rtt(check_listen, "/api/status")?;
    require_delay("to node 1's admin port through a proxy", rtt, delay)?;
    dc.rtt_delay_ms = rtt.as_secs_f64() * 1e3;
    if let Some((_, listen)) = rig.base.clients.iter().find_map(|c| c.proxy.as_ref()) {
        let r = nbd_rtt(listen)?;
        require_delay("to a baseline qemu-nbd through its proxy", r, delay)?;
        dc.baseline_rtt_delay_ms = Some(r.as_secs_f64() * 1e3);
    }
    Ok(())
}

fn run_in(cfg: &PaperConfig, work: &Path, cancel: &Cancel) -> Result<Report> {
    let started = Instant::now();
    let (mut rig, proxies, check_listen) = start_rig(cfg, work, cancel)?;
    let mut dc = DelayCheck::default();
    prefill_and_check_routes(&mut rig, cfg, cancel, &mut dc)?;
    dc.rtt_no_delay_ms = http_rtt(&check_listen, "/api/status")?.as_secs_f64() * 1e3;

    let mut acc: BTreeMap<PointKey, (Vec<RepeatSample>, Traffic)> = BTreeMap::new();
    let mut progress = Progress::new(cfg.points(), cfg.repeat, cfg.runtime_secs as f64 + 1.0);
    let mut delay_now = 0;
    for run in schedule(cfg) {
        let PointKey {
            system,
            op,
            x,
            delay_ms: delay,
        } = run.key;
        if delay != delay_now {
            add_delay(&mut rig, &proxies, &check_listen, delay, &mut dc)?;
            progress.note(&format!(
                "WAN delay {delay} ms in effect: round trip through a proxy {:.1} ms (was {:.1} ms)",
                dc.rtt_delay_ms, dc.rtt_no_delay_ms
            ));
            delay_now = delay;
        }
        cancel.check()?;
        progress.begin(
            run.point,
            &format!(
                "{} {} X={x} delay={delay}ms repeat {}/{}",
                system.name(),
                op.name(),
                run.rep + 1,
                cfg.repeat
            ),
        );
        let t0 = Instant::now();
        let (sample, traffic) = measure(&mut rig, cfg, run.key, run.rep, cancel)?;
        progress.end_run(t0.elapsed().as_secs_f64());
        let e = acc.entry(run.key).or_default();
        e.0.push(sample);
        add_traffic(&mut e.1, &traffic);
    }
    progress.finish();
    // Free the machine before drawing.
    stop_rig(rig, &mut dc)?;

    let points: Vec<PointResult> = acc
        .into_iter()
        .map(|(k, (reps, t))| PointResult::from_repeats(k.system, k.op, k.x, k.delay_ms, &reps, t))
        .collect();
    let indexes = compute_indexes(&points, &cfg.systems(), &cfg.parallel, cfg.delay_ms);
    write_text(&cfg.out.join("results.csv"), &points_csv(&points))?;
    write_text(&cfg.out.join("indexes.csv"), &indexes_csv(&indexes))?;
    let (charts, charts_note) = match charts::render(&cfg.out) {
        Ok(v) => (v, None),
        Err(why) => {
            say!("charts skipped: {why}");
            (Vec::<PathBuf>::new(), Some(why))
        }
    };
    let mut rep = Report {
        points,
        indexes,
        delay_check: dc,
        out_dir: cfg.out.clone(),
        charts,
        charts_note,
        elapsed_secs: 0.0,
    };
    rep.elapsed_secs = started.elapsed().as_secs_f64();
    write_text(
        &cfg.out.join("results.md"),
        &report::markdown(cfg, &rep, cpu::cores()),
    )?;
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::System;
    use drove_types::WritePolicy;
    use std::collections::BTreeSet;

    #[test]
    fn test_a_failed_run_shows_the_last_warnings_of_each_log() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("cluster").join("node1");
        std::fs::create_dir_all(&node).unwrap();
        let mut text = String::new();
        for i in 0..20 {
            text.push_str(&format!("2026-11-24T10:00:{i:02}Z  INFO x: fine {i}\n"));
            text.push_str(&format!("2026-11-24T10:00:{i:02}Z  WARN x: odd {i}\n"));
        }
        text.push_str("2026-11-24T10:01:00Z ERROR x: broken\n");
        std::fs::write(node.join("node.log"), text).unwrap();
        std::fs::write(dir.path().join("quiet.log"), "all INFO here\n").unwrap();
        std::fs::write(dir.path().join("disk.img"), " WARN not a log\n").unwrap();

        let got = warnings_in_logs(dir.path(), 3);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, node.join("node.log"));
        let lines = &got[0].1;
        assert_eq!(lines.len(), 3);
        assert!(lines[0].ends_with("odd 18"), "{lines:?}");
        assert!(lines[1].ends_with("odd 19"), "{lines:?}");
        assert!(lines[2].ends_with("broken"), "{lines:?}");
    }

    #[test]
    fn test_schedule_runs_every_system_at_every_point() {
        let mut cfg = PaperConfig::example(vec![WritePolicy::Sync, WritePolicy::ZoneSync]);
        cfg.repeat = 2;
        let runs = schedule(&cfg);
        assert_eq!(runs.len(), cfg.points() * cfg.repeat);
        assert_eq!(cfg.points(), 48);
        // Every (system, op, X, delay) once per repeat, under one point number.
        let mut numbers = BTreeMap::new();
        for r in &runs {
            numbers
                .entry(r.key)
                .or_insert_with(Vec::new)
                .push((r.point, r.rep));
        }
        assert_eq!(numbers.len(), cfg.points());
        for (key, v) in &numbers {
            assert_eq!(v.len(), 2, "{key:?}");
            assert_eq!(v[0].0, v[1].0, "{key:?}: one number for both repeats");
            assert_eq!((v[0].1, v[1].1), (0, 1));
        }
        let distinct: BTreeSet<usize> = numbers.values().map(|v| v[0].0).collect();
        assert_eq!(distinct, (1..=cfg.points()).collect());
        for system in System::ALL {
            assert_eq!(
                runs.iter().filter(|r| r.key.system == system).count(),
                16 * 2,
                "{system:?}"
            );
        }
        // Each repeat runs the systems in turn: sync, zone-sync, then the baseline.
        let first: Vec<(System, usize, usize)> = runs[..6]
            .iter()
            .map(|r| (r.key.system, r.point, r.rep))
            .collect();
        use System::{Baseline, Drove, DroveZoneSync};
        assert_eq!(
            first,
            [
                (Drove, 1, 0),
                (DroveZoneSync, 2, 0),
                (Baseline, 3, 0),
                (Drove, 1, 1),
                (DroveZoneSync, 2, 1),
                (Baseline, 3, 1)
            ]
        );
        // No delay first, then the delay: the toxics go on once.
        let switch = runs.iter().position(|r| r.key.delay_ms == 10).unwrap();
        assert_eq!(switch, runs.len() / 2);
        assert!(runs[switch..].iter().all(|r| r.key.delay_ms == 10));
        assert_eq!(runs.last().map(|r| r.point), Some(48));
    }

    #[test]
    fn test_schedule_with_one_policy_has_no_other_drove_system() {
        let cfg = PaperConfig::example(vec![WritePolicy::ZoneSync]);
        let runs = schedule(&cfg);
        assert_eq!(runs.len(), 32);
        assert!(runs.iter().all(|r| r.key.system != System::Drove));
        assert_eq!(runs.iter().map(|r| r.point).max(), Some(32));
    }
}
