//! results.md: the human report of a run. Throughput of both systems side by side,
//! the two indexes per operation and X, transfer efficiency, the scale used against
//! the paper's, and which points were CPU-bound (marked `*`: their ratios measure
//! this machine's CPU as much as the storage system).
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{Op, PaperConfig, System, DEFAULT_IODEPTH, PAPER_SCALE};
use crate::index::{fmt_ratio, lookup, IndexKind, IndexRow};
use crate::results::{PointResult, Report, CPU_BOUND_BUSY};

/// UTC date and time as `YYYY-MM-DD-HHMM`, for directory names.
pub fn date_stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}-{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60
    )
}

fn find(pts: &[PointResult], s: System, op: Op, x: usize, d: u64) -> Option<&PointResult> {
    pts.iter()
        .find(|p| p.system == s && p.op == op && p.x == x && p.delay_ms == d)
}

fn mbps(p: Option<&PointResult>) -> String {
    match p {
        Some(p) => format!("{:.2}{}", p.mean_mbps, if p.cpu_bound { "*" } else { "" }),
        None => "n/a".to_string(),
    }
}

fn idx(rows: &[IndexRow], k: IndexKind, s: System, op: Op, x: usize, d: u64) -> String {
    match lookup(rows, k, s, op, x, d) {
        Some(r) => format!(
            "{}{}",
            fmt_ratio(r.value),
            if r.cpu_bound { "*" } else { "" }
        ),
        None => "n/a".to_string(),
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

/// Compare drove's index with the baseline's: `Some(true)` when drove's is at least
/// as high, `None` when either is n/a.
pub fn at_least(rows: &[IndexRow], k: IndexKind, op: Op, x: usize, d: u64) -> Option<bool> {
    let a = lookup(rows, k, System::Drove, op, x, d)?.value?;
    let b = lookup(rows, k, System::Baseline, op, x, d)?.value?;
    // Two decimals are shown; equal at that precision counts as "at least".
    Some(a + 0.005 >= b)
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "n/a",
    }
}

/// Mean MB/s of the clients of `p` in zone 1 and in the other zones (client i is
/// in zone i mod Z + 1), from the repeat nearest the median.
pub fn zone_split(p: &PointResult, zones: usize) -> (Option<f64>, Option<f64>) {
    let (mut z1, mut other) = (Vec::new(), Vec::new());
    for (i, &v) in p.per_client_mbps.iter().enumerate() {
        if crate::wan::client_zone(i, zones) == 1 {
            z1.push(v);
        } else {
            other.push(v);
        }
    }
    (crate::index::mean(&z1), crate::index::mean(&other))
}

fn opt_mbps(v: Option<f64>) -> String {
    v.map_or("n/a".to_string(), |x| format!("{x:.2}"))
}

fn zone_section(s: &mut String, cfg: &PaperConfig, pts: &[PointResult]) {
    let _ = writeln!(s, "## Per-client throughput by zone (MB/s)\n");
    let _ = writeln!(
        s,
        "The mean per client hides where the clients are: the baseline's server is in zone 1. \
         Zone 1 = clients in the baseline server's zone; other = clients in the other zones.\n"
    );
    let _ = writeln!(s, "| op | X | delay ms | drove zone 1 | drove other zones | baseline zone 1 | baseline other zones |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for delay in cfg.delays() {
        for op in Op::ALL {
            for &x in cfg.parallel.iter().filter(|&&x| x > 1) {
                let (Some(a), Some(b)) = (
                    find(pts, System::Drove, op, x, delay),
                    find(pts, System::Baseline, op, x, delay),
                ) else {
                    continue;
                };
                let (a1, ao) = zone_split(a, cfg.zones);
                let (b1, bo) = zone_split(b, cfg.zones);
                let _ = writeln!(
                    s,
                    "| {} | {x} | {delay} | {} | {} | {} | {} |",
                    op.name(),
                    opt_mbps(a1),
                    opt_mbps(ao),
                    opt_mbps(b1),
                    opt_mbps(bo)
                );
            }
        }
    }
    s.push('\n');
}

/// The whole results.md.
pub fn markdown(cfg: &PaperConfig, rep: &Report, cores: usize) -> String {
    let mut s = String::new();
    let pts = &rep.points;
    let rows = &rep.indexes;
    let d = cfg.delay_ms;
    let xs = cfg
        .parallel
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        s,
        "# drove bench paper: drove against a centralized qemu-nbd over a {d} ms WAN\n"
    );
    let _ = writeln!(s, "Command: `{}`  ", cfg.command_line);
    let _ = writeln!(
        s,
        "Run finished {} UTC, took {:.0} s.\n",
        date_stamp(),
        rep.elapsed_secs
    );

    let _ = writeln!(s, "## Scale\n");
    let _ = writeln!(
        s,
        "This run: {} zones x {} nodes = {} drove nodes (copies {}, write policy {}), X = {xs} clients at once, \
         {d} ms one-way delay between zones, {} per client disk, on one machine with {cores} \
         cores that also runs every client, proxy and server.  \nThe paper: {PAPER_SCALE}. \
         This is a scaled-down version of the paper's experiment; its indexes are not the \
         paper's figures, and points where this machine ran out of CPU are marked below.\n",
        cfg.zones,
        cfg.nodes_per_zone,
        cfg.nodes(),
        cfg.copies,
        cfg.policy,
        drove_types::format_size(cfg.size),
    );

    let bound: Vec<&PointResult> = pts.iter().filter(|p| p.cpu_bound).collect();
    let _ = writeln!(s, "## CPU-bound points\n");
    if bound.is_empty() {
        let _ = writeln!(
            s,
            "None: the machine stayed under {:.0}% busy during every run.\n",
            CPU_BOUND_BUSY * 100.0
        );
    } else {
        let _ = writeln!(
            s,
            "**{} of {} points were CPU-bound** (machine more than {:.0}% busy during a run; \
             marked `*` in every table). Their throughput, and every index computed from them, \
             measures this {cores}-core machine (fio, proxies and servers together) as much as \
             the storage system: do not read them as the paper's figures. In brackets: machine \
         busy share, and the share used by the experiment's own processes (nodes, proxies, \
         servers, fio); the difference is other load on the machine.\n",
            bound.len(),
            pts.len(),
            CPU_BOUND_BUSY * 100.0
        );
        let list: Vec<String> = bound
            .iter()
            .map(|p| {
                format!(
                    "{} {} X={} {} ms ({:.0}%, experiment {:.0}%)",
                    p.system.name(),
                    p.op.name(),
                    p.x,
                    p.delay_ms,
                    p.cpu_busy_pct,
                    p.experiment_cpu_pct
                )
            })
            .collect();
        let _ = writeln!(s, "{}\n", list.join("; "));
    }

    let _ = writeln!(s, "## Method\n");
    let dc = &rep.delay_check;
    let base_rtt = dc.baseline_rtt_delay_ms.map_or(
        "not measured (no baseline client outside zone 1)".to_string(),
        |v| format!("{v:.1} ms"),
    );
    let _ = writeln!(
        s,
        "- Clients: one fio process per client (a \"VM\"), `ioengine=nbd`, iodepth={DEFAULT_IODEPTH} \
         (a VM with a few requests in flight, not the paper's exact benchmark), {} s per run \
         (`time_based`), {} repeat(s) per point, median kept of the per-repeat mean per-client \
         throughput. MB/s = 10^6 bytes/s. Disks are prefilled once (1M sequential write of the \
         whole disk) so reads read written data.\n\
         - Client i is in zone (i mod {z}) + 1. drove: one VDI per client (copies {}), attached \
         through a node of its own zone (round-robin) over its unix socket. Baseline: one \
         qemu-nbd per client disk (raw file, writeback cache), all in zone 1; zone-1 clients \
         connect directly over TCP, the others through the proxy.\n\
         - WAN: toxiproxy latency toxics of {d} ms on both directions of every cross-zone \
         connection (each drove node to each node of another zone; each baseline client \
         outside zone 1 to its server). Delay 0 = the same proxies without toxics. Same-zone \
         connections are direct.\n\
         - Delay check before measuring: an HTTP round trip to node 1's admin port through a \
         proxy took {:.1} ms without toxics and {:.1} ms with them (required: >= {} ms); an NBD \
         option round trip through a baseline proxy took {base_rtt}. After the prefill the nodes \
         held {} connection(s) to their proxies and {} straight to a node of another zone \
         (from /proc: the routes files are in effect). Over the whole run the nodes counted \
         {} MB of cross-zone peer traffic (sent + received) and drove's proxies carried {} MB \
         (toxiproxy's count, read when the connections closed at the end).\n\
         - CPU: /proc/stat is read around every run; a run with the machine more than {:.0}% \
         busy marks its point CPU-bound. The experiment's own share (nodes, toxiproxy, \
         qemu-nbd, fio, from /proc/PID/stat) is in results.csv (`experiment_cpu_pct`).\n",
        cfg.runtime_secs,
        cfg.repeat,
        cfg.copies,
        dc.rtt_no_delay_ms,
        dc.rtt_delay_ms,
        2 * d,
        dc.proxied_connections,
        dc.direct_cross_zone_connections,
        mb(dc.run_cross_zone_bytes),
        mb(dc.run_proxy_bytes),
        CPU_BOUND_BUSY * 100.0,
        z = cfg.zones,
    );

    let _ = writeln!(s, "## Throughput per client (MB/s)\n");
    let _ = writeln!(
        s,
        "| op | X | delay ms | drove | baseline | drove / baseline |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for delay in cfg.delays() {
        for op in Op::ALL {
            for &x in &cfg.parallel {
                let a = find(pts, System::Drove, op, x, delay);
                let b = find(pts, System::Baseline, op, x, delay);
                let r = crate::index::ratio(
                    a.map_or(f64::NAN, |p| p.mean_mbps),
                    b.map_or(f64::NAN, |p| p.mean_mbps),
                );
                let _ = writeln!(
                    s,
                    "| {} | {x} | {delay} | {} | {} | {} |",
                    op.name(),
                    mbps(a),
                    mbps(b),
                    fmt_ratio(r)
                );
            }
        }
    }

    let _ = writeln!(s, "\n## ParallelismImpactRatio\n");
    let _ = writeln!(
        s,
        "Mean per-client throughput with X clients at once / with one client, same delay.\n"
    );
    let _ = writeln!(s, "| op | X | drove 0 ms | baseline 0 ms | drove {d} ms | baseline {d} ms | drove >= baseline |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let mut par = (0, 0);
    for op in Op::ALL {
        for &x in &cfg.parallel {
            let mut met = Vec::new();
            for delay in cfg.delays() {
                let m = at_least(rows, IndexKind::Parallelism, op, x, delay);
                if x > 1 {
                    par.1 += usize::from(m.is_some());
                    par.0 += usize::from(m == Some(true));
                }
                met.push(yes_no(m));
            }
            let k = IndexKind::Parallelism;
            let _ = writeln!(
                s,
                "| {} | {x} | {} | {} | {} | {} | {} |",
                op.name(),
                idx(rows, k, System::Drove, op, x, 0),
                idx(rows, k, System::Baseline, op, x, 0),
                idx(rows, k, System::Drove, op, x, d),
                idx(rows, k, System::Baseline, op, x, d),
                if x == 1 {
                    "-".to_string()
                } else {
                    met.join(" / ")
                },
            );
        }
    }

    let _ = writeln!(s, "\n## LatencyImpactRatio\n");
    let _ = writeln!(
        s,
        "Throughput with {d} ms one-way delay between zones / with none, same X.\n"
    );
    let _ = writeln!(s, "| op | X | drove | baseline | drove >= baseline |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    let mut lat = (0, 0);
    for op in Op::ALL {
        for &x in &cfg.parallel {
            let k = IndexKind::Latency;
            let m = at_least(rows, k, op, x, d);
            lat.1 += usize::from(m.is_some());
            lat.0 += usize::from(m == Some(true));
            let _ = writeln!(
                s,
                "| {} | {x} | {} | {} | {} |",
                op.name(),
                idx(rows, k, System::Drove, op, x, d),
                idx(rows, k, System::Baseline, op, x, d),
                yes_no(m)
            );
        }
    }

    let _ = writeln!(s, "\n## Targets\n");
    let _ = writeln!(
        s,
        "- drove's LatencyImpactRatio >= the baseline's: {} of {} (operation, X) cases.\n\
         - drove's ParallelismImpactRatio >= the baseline's (X > 1, both delays): {} of {} cases.\n",
        lat.0, lat.1, par.0, par.1
    );

    zone_section(&mut s, cfg, pts);
    s.push_str(&crate::report_traffic::traffic_sections(cfg, pts));

    let _ = writeln!(s, "\n## Charts\n");
    if rep.charts.is_empty() {
        let why = rep.charts_note.as_deref().unwrap_or("not drawn");
        let _ = writeln!(s, "Charts skipped: {why}.");
    } else {
        for c in &rep.charts {
            if let Some(name) = c.file_name() {
                let n = name.to_string_lossy();
                let _ = writeln!(s, "![{n}]({n})");
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_zone_split_follows_client_placement() {
        let mut p = PointResult::empty(System::Baseline, Op::SmallRead, 5, 10);
        // 4 zones: clients 0 and 4 are in zone 1.
        p.per_client_mbps = vec![10.0, 1.0, 2.0, 3.0, 20.0];
        assert_eq!(zone_split(&p, 4), (Some(15.0), Some(2.0)));
        p.per_client_mbps = vec![10.0];
        assert_eq!(zone_split(&p, 4), (Some(10.0), None));
    }

    #[test]
    fn test_date_stamp_shape() {
        let d = date_stamp();
        assert_eq!(d.len(), 15, "{d}");
        assert!(d.starts_with("20"), "{d}");
        assert_eq!(&d[4..5], "-");
        assert_eq!(&d[10..11], "-");
    }
}
