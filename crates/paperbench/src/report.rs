//! results.md: the human report of a run. The scale used against the paper's, the
//! method, which points were CPU-bound (marked `*`: their ratios measure this
//! machine's CPU as much as the storage system), then the tables of
//! [`crate::report_compare`] (every drove system beside the baseline: throughput,
//! the two indexes) and [`crate::report_traffic`] (bytes moved), and the charts.
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{PaperConfig, DEFAULT_IODEPTH, PAPER_SCALE};
use crate::report_compare;
use crate::results::{PointResult, Report, CPU_BOUND_BUSY};

/// UTC date and time as `YYYY-MM-DD-HHMM`, for directory names.
pub fn date_stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let t = drove_types::Utc::from_unix(secs);
    format!(
        "{:04}-{:02}-{:02}-{:02}{:02}",
        t.year, t.month, t.day, t.hour, t.minute
    )
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
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

    let pol = if cfg.policies.len() == 1 {
        format!("write policy {}", cfg.policies_text())
    } else {
        format!(
            "write policies {}, one drove system each",
            cfg.policies_text()
        )
    };
    let _ = writeln!(s, "## Scale\n");
    let _ = writeln!(
        s,
        "This run: {} zones x {} nodes = {} drove nodes (copies {}, {pol}), X = {xs} clients at once, \
         {d} ms one-way delay between zones, {} per client disk, on one machine with {cores} \
         cores that also runs every client, proxy and server.  \nThe paper: {PAPER_SCALE}. \
         This is a scaled-down version of the paper's experiment; its indexes are not the \
         paper's figures, and points where this machine ran out of CPU are marked below.\n",
        cfg.zones,
        cfg.nodes_per_zone,
        cfg.nodes(),
        cfg.copies,
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
    let n = cfg.clients();
    let vdis = cfg
        .drove_systems()
        .into_iter()
        .filter_map(|sy| {
            let first = sy.vdi_name(0)?;
            let last = sy.vdi_name(n.saturating_sub(1))?;
            let names = if n > 1 {
                format!("{first}..{last}")
            } else {
                first
            };
            Some(format!("{names} {}", sy.policy()?))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let order = cfg
        .systems()
        .iter()
        .map(|sy| sy.label())
        .collect::<Vec<_>>()
        .join(", ");
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
         - Client i is in zone (i mod {z}) + 1. drove: one cluster; one VDI per client and \
         write policy ({vdis}; copies {}), attached and prefilled through a node of the \
         client's zone (round-robin) over its unix socket, so each VDI's home zone is its \
         client's. Baseline: one qemu-nbd per client disk (raw file, writeback cache), all in \
         zone 1; zone-1 clients connect directly over TCP, the others through the proxy. At \
         every point the systems run one after the other ({order}), each repeat in turn.\n\
         - WAN: {proxy} of {d} ms on both directions of every cross-zone \
         connection (each drove node to each node of another zone; each baseline client \
         outside zone 1 to its server). Delay 0 = the same proxies without toxics. Same-zone \
         connections are direct.\n\
         - Delay check before measuring: an HTTP round trip to node 1's admin port through a \
         proxy took {:.1} ms without toxics and {:.1} ms with them (required: >= {} ms); an NBD \
         option round trip through a baseline proxy took {base_rtt}. After the prefill the nodes \
         held {} connection(s) to their proxies and {} straight to a node of another zone \
         (from /proc: the routes files are in effect). Over the whole run the nodes counted \
         {} MB of cross-zone peer traffic (sent + received) and drove's proxies carried {} MB \
         (the proxy's count, read when the connections closed at the end).\n\
         - CPU: /proc/stat is read around every run; a run with the machine more than {:.0}% \
         busy marks its point CPU-bound. The experiment's own share (nodes, the proxy, \
         qemu-nbd, fio, from /proc/PID/stat) is in results.csv (`experiment_cpu_pct`).\n\
         - Failure detector: {down_after}.\n",
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
        down_after = match cfg.down_after_secs {
            Some(s) => format!(
                "a node is marked down after {s} s without heartbeats (`--down-after`; \
                 the node default is 5 s): on one host CPU starvation is not a failure"
            ),
            None => "the node default (down after 5 s without heartbeats)".to_string(),
        },
        proxy = match cfg.wan_proxy {
            crate::toxiproxy::WanProxyKind::Builtin => {
                "drove's WAN proxy (`drove bench wan-proxy`), delays"
            }
            crate::toxiproxy::WanProxyKind::Toxiproxy => "toxiproxy latency toxics",
        },
    );

    report_compare::throughput_section(&mut s, cfg, pts);
    let par = report_compare::parallelism_section(&mut s, cfg, rows);
    let lat = report_compare::latency_section(&mut s, cfg, rows);
    report_compare::targets_section(&mut s, cfg, &par, &lat);
    report_compare::zone_section(&mut s, cfg, pts);
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
    use crate::config::{Op, System};
    use crate::index::compute_indexes;
    use crate::results::DelayCheck;
    use drove_types::WritePolicy;

    /// A report with every point of `cfg`'s systems measured at `mbps` MB/s.
    fn report(cfg: &PaperConfig, mbps: f64) -> Report {
        let mut points = Vec::new();
        for system in cfg.systems() {
            for delay in cfg.delays() {
                for &x in &cfg.parallel {
                    for op in Op::ALL {
                        let mut p = PointResult::empty(system, op, x, delay);
                        p.mean_mbps = mbps;
                        p.per_client_mbps = vec![mbps; x];
                        points.push(p);
                    }
                }
            }
        }
        let indexes = compute_indexes(&points, &cfg.systems(), &cfg.parallel, cfg.delay_ms);
        Report {
            points,
            indexes,
            delay_check: DelayCheck::default(),
            out_dir: cfg.out.clone(),
            charts: Vec::new(),
            charts_note: Some("test".to_string()),
            elapsed_secs: 1.0,
        }
    }

    fn header_of<'a>(md: &'a str, section: &str) -> &'a str {
        let body = &md[md.find(section).unwrap_or_else(|| panic!("no {section}"))..];
        body.lines()
            .find(|l| l.starts_with("| op |"))
            .unwrap_or_else(|| panic!("no table in {section}"))
    }

    #[test]
    fn test_markdown_names_both_policies_and_shows_every_system() {
        let cfg = PaperConfig::example(vec![WritePolicy::Sync, WritePolicy::ZoneSync]);
        let md = markdown(&cfg, &report(&cfg, 10.0), 2);
        assert!(
            md.contains("(copies 3, write policies sync, zone-sync, one drove system each)"),
            "{md}"
        );
        assert!(md.contains("c0..c1 sync, z0..z1 zone-sync"), "{md}");
        assert!(
            md.contains("(drove sync, drove zone-sync, baseline)"),
            "{md}"
        );
        for section in [
            "## Throughput per client",
            "## ParallelismImpactRatio",
            "## LatencyImpactRatio",
            "## Per-client throughput by zone",
            "## Transfer efficiency",
            "## Reads:",
        ] {
            let h = header_of(&md, section);
            for sy in [System::Drove, System::DroveZoneSync] {
                assert!(h.contains(sy.label()), "{section}: {h}");
            }
            assert!(h.contains("baseline"), "{section}: {h}");
        }
        // Equal throughput everywhere: every comparison is met.
        assert!(md.contains("- drove sync: LatencyImpactRatio >= the baseline's in 8 of 8"));
        assert!(md.contains("- drove zone-sync: LatencyImpactRatio >= the baseline's in 8 of 8"));
        assert!(!md.contains("**no**"), "{md}");
        assert!(md.contains("Charts skipped: test."));
    }

    #[test]
    fn test_markdown_with_one_policy_says_which() {
        let cfg = PaperConfig::example(vec![WritePolicy::ZoneSync]);
        let md = markdown(&cfg, &report(&cfg, 10.0), 2);
        assert!(md.contains("(copies 3, write policy zone-sync)"), "{md}");
        assert!(!md.contains("drove sync"), "{md}");
        assert!(header_of(&md, "## Throughput per client").contains("drove zone-sync"));
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
