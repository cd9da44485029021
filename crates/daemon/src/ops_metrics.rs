//! Operations metrics computed at scrape time and added to `/metrics`: build info,
//! process metrics (from `/proc/self`), the cluster map as this node sees it (nodes
//! up and down, epoch, VDIs), the store's disk space and this node's recovery
//! progress. Nothing here is kept between scrapes, so a node that leaves the map
//! leaves the per-node series with it.
//!
//! The text is OpenMetrics (what `/metrics` serves): each family has its `# HELP`
//! and `# TYPE` lines, a counter's sample carries `_total`, and the families go in
//! before the registry's closing `# EOF`.
use std::fmt::Write as _;

use drove_types::NodeState;

use crate::admin::Admin;

/// What the process reads about itself in `/proc/self`.
#[derive(Debug, Clone, Default, PartialEq)]
struct Process {
    cpu_seconds: f64,
    resident_bytes: u64,
    open_fds: u64,
    max_fds: Option<u64>,
    start_time_seconds: f64,
}

/// One node of the cluster map.
#[derive(Debug, Clone, PartialEq)]
struct NodeRow {
    id: u64,
    zone: String,
    up: bool,
}

/// Everything rendered, gathered first so that rendering is a pure function.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    version: String,
    process: Option<Process>,
    nodes: Vec<NodeRow>,
    epoch: u64,
    vdis: u64,
    voters: u64,
    /// The maintenance flag `noout` is set.
    noout: bool,
    /// Objects in the store at the last count (at most a minute old).
    objects: Option<u64>,
    /// Size and free space of the store's filesystem.
    disk: Option<(u64, u64)>,
    recovery: drove_replica::Progress,
    scrub: drove_replica::ScrubTotals,
}

/// `base` (the registry's text, ending in `# EOF`) with the operations metrics of
/// node `a` added before its `# EOF`.
pub(crate) fn encode(a: &Admin, base: String, objects: Option<u64>) -> String {
    insert(base, &render(&snapshot(a, objects)))
}

fn snapshot(a: &Admin, objects: Option<u64>) -> Snapshot {
    let state = a.meta.state();
    let status = a.meta.status();
    Snapshot {
        version: env!("CARGO_PKG_VERSION").to_string(),
        process: process(),
        nodes: state
            .map
            .nodes
            .values()
            .map(|n| NodeRow {
                id: n.id.0,
                zone: n.zone.clone(),
                up: n.state == NodeState::Up,
            })
            .collect(),
        epoch: state.map.epoch.0,
        vdis: state.vdis.len() as u64,
        voters: status.voters.len() as u64,
        noout: state.settings.noout,
        objects,
        disk: crate::health::disk_space(&a.store_dir),
        recovery: a.recoverer.progress(),
        scrub: a.recoverer.scrub_totals(),
    }
}

/// `extra` put before the closing `# EOF` of `base` (at the end if there is none).
fn insert(mut base: String, extra: &str) -> String {
    const EOF: &str = "# EOF\n";
    if base.ends_with(EOF) {
        base.truncate(base.len() - EOF.len());
        base.push_str(extra);
        base.push_str(EOF);
    } else {
        base.push_str(extra);
    }
    base
}

/// A label value escaped for the text format.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes families into one string.
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = write!(self.0, "{{{}}}", l.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// A gauge family with one unlabelled sample.
    fn gauge(&mut self, name: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, "gauge", help);
        self.sample(name, &[], value);
    }
}

/// A float the way the text format wants it (always with a decimal point or
/// exponent, so that it reads as the float it is).
fn float(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn render(s: &Snapshot) -> String {
    let mut o = Out(String::new());
    o.family("drove_build", "info", "The drove build this node runs");
    o.sample("drove_build_info", &[("version", &s.version)], 1);

    if let Some(p) = &s.process {
        o.family(
            "drove_process_cpu_seconds",
            "counter",
            "User and system CPU time spent by this node's process, in seconds",
        );
        o.sample("drove_process_cpu_seconds_total", &[], float(p.cpu_seconds));
        o.gauge(
            "drove_process_resident_memory_bytes",
            "Resident memory of this node's process, in bytes",
            p.resident_bytes,
        );
        o.gauge(
            "drove_process_open_fds",
            "Open file descriptors of this node's process",
            p.open_fds,
        );
        if let Some(max) = p.max_fds {
            o.gauge(
                "drove_process_max_fds",
                "Limit on open file descriptors of this node's process",
                max,
            );
        }
        o.gauge(
            "drove_process_start_time_seconds",
            "Start time of this node's process, in seconds since the Unix epoch",
            float(p.start_time_seconds),
        );
    }

    let up = s.nodes.iter().filter(|n| n.up).count();
    o.family(
        "drove_cluster_nodes",
        "gauge",
        "Nodes in the cluster map as this node sees it, by state (up, down)",
    );
    o.sample("drove_cluster_nodes", &[("state", "up")], up);
    o.sample(
        "drove_cluster_nodes",
        &[("state", "down")],
        s.nodes.len() - up,
    );
    if !s.nodes.is_empty() {
        o.family(
            "drove_cluster_node_up",
            "gauge",
            "1 for each node of the cluster map that is up, 0 for one marked down \
             (a removed node has no series)",
        );
        for n in &s.nodes {
            let id = n.id.to_string();
            o.sample(
                "drove_cluster_node_up",
                &[("node", &id), ("zone", &n.zone)],
                u8::from(n.up),
            );
        }
    }
    o.gauge(
        "drove_cluster_epoch",
        "Epoch of the cluster map as this node sees it",
        s.epoch,
    );
    o.gauge(
        "drove_cluster_vdis",
        "VDIs in the metadata as this node sees it",
        s.vdis,
    );
    o.gauge(
        "drove_meta_voters",
        "Voting members of the metadata Raft group as this node sees it",
        s.voters,
    );
    o.gauge(
        "drove_cluster_noout",
        "1 while the maintenance flag noout is set (down nodes are not re-replicated)",
        u8::from(s.noout),
    );

    if let Some(n) = s.objects {
        o.gauge(
            "drove_store_objects",
            "Objects (copies) in this node's store, counted at most a minute ago",
            n,
        );
    }
    if let Some((size, free)) = s.disk {
        o.gauge(
            "drove_store_disk_bytes",
            "Size of the filesystem holding this node's object store (used plus \
             available to non-root), in bytes",
            size,
        );
        o.gauge(
            "drove_store_disk_free_bytes",
            "Space available to non-root on the filesystem holding this node's \
             object store, in bytes",
            free,
        );
    }

    let r = &s.recovery;
    o.gauge(
        "drove_recovery_epoch",
        "The epoch this node's recovery pass works towards",
        r.epoch,
    );
    o.gauge(
        "drove_recovery_backlog_objects",
        "Objects this node still has to recover in its current pass",
        r.total.saturating_sub(r.done),
    );
    o.gauge(
        "drove_recovery_failed_objects",
        "Objects whose copy failed (and is retried) in this node's current recovery pass",
        r.failed,
    );
    o.gauge(
        "drove_recovery_copied_bytes",
        "Bytes this node copied in its current recovery pass",
        r.bytes,
    );
    o.gauge(
        "drove_recovery_rate_bytes_per_second",
        "Bytes per second this node copied over its current recovery pass",
        float(r.rate_bytes_s),
    );
    o.gauge(
        "drove_recovery_waiting_noout_objects",
        "Objects of this node's recovery backlog held back by noout (here only because a node is down)",
        r.waiting_noout,
    );
    o.gauge(
        "drove_recovery_waiting_full_objects",
        "Objects of this node's recovery backlog held back because its disk is fuller than the cluster's backfill-full setting",
        r.waiting_full,
    );
    o.gauge(
        "drove_recovery_clean",
        "1 when this node holds every object it should at its recovery epoch",
        u8::from(r.clean),
    );

    let sc = &s.scrub;
    for (name, help, value) in [
        (
            "drove_scrub_runs",
            "Scrubs of this node's objects finished since the process started (background and `drove cluster scrub`)",
            sc.runs,
        ),
        (
            "drove_scrub_objects",
            "Objects whose every block checksum a scrub of this node verified",
            sc.objects,
        ),
        (
            "drove_scrub_corrupt_objects",
            "Copies on this node a scrub found failing their checksums",
            sc.corrupt,
        ),
        (
            "drove_scrub_repaired_objects",
            "Of those, copies that read whole after the scrub mended or replaced them",
            sc.repaired,
        ),
    ] {
        o.family(name, "counter", help);
        o.sample(&format!("{name}_total"), &[], value);
    }
    if sc.runs > 0 {
        o.gauge(
            "drove_scrub_last_end_time_seconds",
            "When the last scrub of this node's objects finished, seconds since the Unix epoch",
            sc.last_unix,
        );
    }
    o.0
}

/// This process as `/proc/self` describes it; `None` where there is no procfs.
fn process() -> Option<Process> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let tick = rustix::param::clock_ticks_per_second();
    let page = rustix::param::page_size();
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| boot_time(&s));
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| max_open_files(&s));
    let mut p = parse_stat(&stat, tick.max(1) as f64, page.max(1) as u64, boot?)?;
    p.open_fds = open_fds;
    p.max_fds = max_fds;
    Some(p)
}

/// CPU time, resident memory and start time from the text of `/proc/self/stat`.
fn parse_stat(stat: &str, tick: f64, page: u64, boot: u64) -> Option<Process> {
    // The command name (field 2) is in parentheses and may hold anything: the
    // fields counted here start after its closing one, at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let utime = field(14)?;
    let stime = field(15)?;
    let start = field(22)?;
    let rss = field(24)?;
    Some(Process {
        cpu_seconds: (utime + stime) as f64 / tick,
        resident_bytes: rss.saturating_mul(page),
        open_fds: 0,
        max_fds: None,
        start_time_seconds: boot as f64 + start as f64 / tick,
    })
}

/// The boot time (`btime`, seconds since the epoch) in the text of `/proc/stat`.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit on open files in the text of `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> Snapshot {
        Snapshot {
            version: "1.2.3".to_string(),
            process: Some(Process {
                cpu_seconds: 1.5,
                resident_bytes: 4096,
                open_fds: 7,
                max_fds: Some(1024),
                start_time_seconds: 1_700_000_000.0,
            }),
            nodes: vec![
                NodeRow {
                    id: 1,
                    zone: "z1".to_string(),
                    up: true,
                },
                NodeRow {
                    id: 2,
                    zone: "z\"2".to_string(),
                    up: false,
                },
            ],
            epoch: 5,
            vdis: 3,
            voters: 3,
            noout: true,
            objects: Some(42),
            disk: Some((1000, 250)),
            recovery: drove_replica::Progress {
                epoch: 5,
                total: 10,
                done: 4,
                failed: 1,
                bytes: 2048,
                rate_bytes_s: 512.0,
                clean: false,
                waiting_noout: 2,
                waiting_full: 3,
                ..Default::default()
            },
            scrub: drove_replica::ScrubTotals {
                runs: 2,
                objects: 30,
                corrupt: 3,
                repaired: 2,
                last_unix: 1_800_000_000,
            },
        }
    }

    #[test]
    fn test_ops_metrics_render_the_exact_text() {
        let text = render(&snap());
        for line in [
            "# HELP drove_build The drove build this node runs",
            "# TYPE drove_build info",
            "drove_build_info{version=\"1.2.3\"} 1",
            "# TYPE drove_process_cpu_seconds counter",
            "drove_process_cpu_seconds_total 1.5",
            "# TYPE drove_process_resident_memory_bytes gauge",
            "drove_process_resident_memory_bytes 4096",
            "drove_process_open_fds 7",
            "drove_process_max_fds 1024",
            "drove_process_start_time_seconds 1700000000.0",
            "# TYPE drove_cluster_nodes gauge",
            "drove_cluster_nodes{state=\"up\"} 1",
            "drove_cluster_nodes{state=\"down\"} 1",
            "drove_cluster_node_up{node=\"1\",zone=\"z1\"} 1",
            "drove_cluster_node_up{node=\"2\",zone=\"z\\\"2\"} 0",
            "drove_cluster_epoch 5",
            "drove_cluster_vdis 3",
            "drove_meta_voters 3",
            "drove_cluster_noout 1",
            "drove_store_objects 42",
            "drove_store_disk_bytes 1000",
            "drove_store_disk_free_bytes 250",
            "drove_recovery_epoch 5",
            "drove_recovery_backlog_objects 6",
            "drove_recovery_failed_objects 1",
            "drove_recovery_copied_bytes 2048",
            "drove_recovery_rate_bytes_per_second 512.0",
            "drove_recovery_waiting_noout_objects 2",
            "drove_recovery_waiting_full_objects 3",
            "drove_recovery_clean 0",
            "# TYPE drove_scrub_runs counter",
            "drove_scrub_runs_total 2",
            "drove_scrub_objects_total 30",
            "drove_scrub_corrupt_objects_total 3",
            "drove_scrub_repaired_objects_total 2",
            "drove_scrub_last_end_time_seconds 1800000000",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from\n{text}"
            );
        }
    }

    #[test]
    fn test_ops_metrics_every_sample_has_its_family_declared_once_before_it() {
        let text = render(&snap());
        let mut declared: Vec<(String, String)> = Vec::new();
        let mut helps = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    !declared.iter().any(|(n, _)| n == name),
                    "{name} declared twice"
                );
                declared.push((name.to_string(), kind.to_string()));
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split_once(' ').unwrap().0;
                assert!(helps.insert(name.to_string()), "{name}: two HELP lines");
            } else {
                let sample = line.split(['{', ' ']).next().unwrap();
                let (family, kind) = declared.last().expect("a sample before any TYPE");
                let want = match kind.as_str() {
                    "counter" => format!("{family}_total"),
                    "info" => format!("{family}_info"),
                    _ => family.clone(),
                };
                assert_eq!(sample, want, "sample {line:?} under family {family}");
                assert!(helps.contains(family), "{family} has no HELP");
            }
        }
    }

    #[test]
    fn test_ops_metrics_go_before_the_eof_and_a_removed_node_leaves_no_series() {
        let base = "# TYPE drove_x gauge\ndrove_x 1\n# EOF\n".to_string();
        let mut s = snap();
        s.nodes.retain(|n| n.id != 2);
        let text = insert(base, &render(&s));
        assert!(text.starts_with("# TYPE drove_x gauge\ndrove_x 1\n"));
        assert!(
            text.ends_with("drove_scrub_last_end_time_seconds 1800000000\n# EOF\n"),
            "{text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(!text.contains("node=\"2\""), "{text}");
        assert!(text.contains("drove_cluster_nodes{state=\"down\"} 0"));
    }

    #[test]
    fn test_ops_metrics_parse_proc_self() {
        let stat = "1234 (a (weird) name) S 1 2 3 4 5 6 7 8 9 10 200 100 0 0 20 0 \
                    8 0 5000 123456789 300 18446744073709551615";
        let p = parse_stat(stat, 100.0, 4096, 1_600_000_000).unwrap();
        assert_eq!(p.cpu_seconds, 3.0);
        assert_eq!(p.resident_bytes, 300 * 4096);
        assert_eq!(p.start_time_seconds, 1_600_000_050.0);
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1600000000\n"),
            Some(1_600_000_000)
        );
        assert_eq!(
            max_open_files(
                "Limit Soft Limit Hard Limit Units\nMax open files            1024                 524288               files\n"
            ),
            Some(1024)
        );
        // And the real thing.
        let me = process().expect("this test runs on Linux with /proc");
        assert!(me.resident_bytes > 0 && me.open_fds > 0, "{me:?}");
        assert!(me.start_time_seconds > 1_000_000_000.0, "{me:?}");
    }
}
