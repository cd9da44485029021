//! The whole experiment, in order: check the tools, start toxiproxy and the drove
//! cluster, lay out the WAN (routes files before any I/O), create one disk per
//! client on every system (one drove VDI per client and write policy, in the one
//! cluster), prefill them, check that cross-zone traffic goes through the proxies,
//! then for each delay (0, then the delay after the toxics are added and a round
//! trip proves them) run every (X, operation) point, repeats interleaved across
//! the systems (drove with each policy, then the baseline). Everything started is stopped on every path
//! (guards), then results.csv, indexes.csv, results.md and the charts are written.
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::baseline::Baseline;
use crate::charts;
use crate::cluster::DroveCluster;
use crate::config::{Op, PaperConfig};
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
use crate::toxiproxy::{self, Toxiproxy};
use crate::wan::{client_node, cross_zone_pairs, http_rtt, nbd_rtt, require_delay};

/// Name of the proxy used for the delay check (to node 1's admin port).
const CHECK_PROXY: &str = "check-admin";

/// What is missing to run the experiment (empty when everything is there).
pub fn missing_tools() -> Vec<String> {
    let mut m = Vec::new();
    if !on_path("fio") {
        m.push("fio (apt-get install fio)".to_string());
    }
    if !on_path("qemu-nbd") {
        m.push("qemu-nbd (apt-get install qemu-utils)".to_string());
    }
    if toxiproxy::find_binary().is_none() {
        m.push(format!("toxiproxy ({})", toxiproxy::INSTALL_HINT));
    }
    m
}

/// Run the experiment described by `cfg`; `cancel` stops it (everything started
/// is stopped before this returns).
pub fn run(cfg: &PaperConfig, cancel: &Cancel) -> Result<Report> {
    cfg.validate()?;
    let missing = missing_tools();
    if !missing.is_empty() {
        bail!("Missing tools: {}", missing.join("; "));
    }
    if !cfg.drove_bin.is_file() {
        bail!("No drove binary at {}", cfg.drove_bin.display());
    }
    let tox_bin = toxiproxy::find_binary().ok_or_else(|| anyhow!("toxiproxy disappeared"))?;
    std::fs::create_dir_all(&cfg.out)
        .with_context(|| format!("Cannot create {}", cfg.out.display()))?;
    let work = cfg.out.join(format!("work-{}", std::process::id()));
    std::fs::create_dir_all(work.join("fio"))
        .with_context(|| format!("Cannot create {}", work.display()))?;
    let res = run_in(cfg, &work, &tox_bin, cancel);
    match &res {
        Ok(_) => {
            let _ = std::fs::remove_dir_all(&work);
        }
        Err(_) => {
            // Keep the logs to explain the failure; drop the disks (gigabytes).
            prune_keep_logs(&work);
            say!("logs of the failed run are in {}", work.display());
        }
    }
    res
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
    tox_bin: &Path,
    cancel: &Cancel,
) -> Result<(Rig, Vec<String>, String)> {
    let toxi = Toxiproxy::start(tox_bin, &work.join("toxiproxy.log"), cancel)?;
    say!(
        "starting drove: {} zones x {} nodes, copies {}, write policies {}; toxiproxy API at {}",
        cfg.zones,
        cfg.nodes_per_zone,
        cfg.copies,
        cfg.policies_text(),
        toxi.api()
    );
    let cluster = DroveCluster::start(
        &cfg.drove_bin,
        &work.join("cluster"),
        cfg.zones,
        cfg.nodes_per_zone,
        cfg.copies,
    )?;
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
    let port_of = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
    };
    for (i, node) in rig.cluster.nodes.iter().enumerate() {
        let routes = rig.routes.get(i).cloned().unwrap_or_default();
        let proxy_ports: HashSet<u16> = routes.values().filter_map(|a| port_of(a)).collect();
        let direct_ports: HashSet<u16> = routes.keys().filter_map(|a| port_of(a)).collect();
        let conns = sockets::connections_of(node.pid)
            .with_context(|| format!("Cannot list the connections of node {}", node.id))?;
        let (via, direct) = sockets::classify(&conns, &proxy_ports, &direct_ports);
        dc.proxied_connections += via;
        dc.direct_cross_zone_connections += direct;
    }
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

fn run_in(cfg: &PaperConfig, work: &Path, tox_bin: &Path, cancel: &Cancel) -> Result<Report> {
    let started = Instant::now();
    let (mut rig, proxies, check_listen) = start_rig(cfg, work, tox_bin, cancel)?;
    let mut dc = DelayCheck::default();
    prefill_and_check_routes(&mut rig, cfg, cancel, &mut dc)?;
    dc.rtt_no_delay_ms = http_rtt(&check_listen, "/api/status")?.as_secs_f64() * 1e3;

    let mut acc: BTreeMap<PointKey, (Vec<RepeatSample>, Traffic)> = BTreeMap::new();
    let mut progress = Progress::new(cfg.points(), cfg.repeat, cfg.runtime_secs as f64 + 1.0);
    let nx = cfg.parallel.len();
    let systems = cfg.systems();
    let ns = systems.len();
    for (di, delay) in cfg.delays().into_iter().enumerate() {
        if delay > 0 {
            for p in &proxies {
                rig.toxi.add_latency(p, delay)?;
            }
            let rtt = http_rtt(&check_listen, "/api/status")?;
            require_delay("to node 1's admin port through a proxy", rtt, delay)?;
            dc.rtt_delay_ms = rtt.as_secs_f64() * 1e3;
            if let Some((_, listen)) = rig.base.clients.iter().find_map(|c| c.proxy.as_ref()) {
                let r = nbd_rtt(listen)?;
                require_delay("to a baseline qemu-nbd through its proxy", r, delay)?;
                dc.baseline_rtt_delay_ms = Some(r.as_secs_f64() * 1e3);
            }
            progress.note(&format!(
                "WAN delay {delay} ms in effect: round trip through a proxy {:.1} ms (was {:.1} ms)",
                dc.rtt_delay_ms, dc.rtt_no_delay_ms
            ));
        }
        for (xi, &x) in cfg.parallel.iter().enumerate() {
            for (oi, op) in Op::ALL.into_iter().enumerate() {
                for rep in 0..cfg.repeat {
                    for (si, &system) in systems.iter().enumerate() {
                        cancel.check()?;
                        let point = ((di * nx + xi) * Op::ALL.len() + oi) * ns + si + 1;
                        progress.begin(
                            point,
                            &format!(
                                "{} {} X={x} delay={delay}ms repeat {}/{}",
                                system.name(),
                                op.name(),
                                rep + 1,
                                cfg.repeat
                            ),
                        );
                        let t0 = Instant::now();
                        let key = PointKey {
                            system,
                            op,
                            x,
                            delay_ms: delay,
                        };
                        let (sample, traffic) = measure(&mut rig, cfg, key, rep, cancel)?;
                        progress.end_run(t0.elapsed().as_secs_f64());
                        let e = acc.entry(key).or_default();
                        e.0.push(sample);
                        add_traffic(&mut e.1, &traffic);
                    }
                }
            }
        }
    }
    progress.finish();
    // Free the machine before drawing.
    stop_rig(rig, &mut dc)?;

    let points: Vec<PointResult> = acc
        .into_iter()
        .map(|(k, (reps, t))| PointResult::from_repeats(k.system, k.op, k.x, k.delay_ms, &reps, t))
        .collect();
    let indexes = compute_indexes(&points, &systems, &cfg.parallel, cfg.delay_ms);
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
