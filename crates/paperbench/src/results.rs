//! Measured points and their CSV form. A point is one (system, operation, X,
//! delay): the median over its repeats of the mean per-client throughput, the
//! per-client numbers behind it, the machine load, and the bytes moved. results.csv
//! has one row per point; indexes.csv one row per computed index.
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

use crate::config::{Op, System};
use crate::index::{mean, median, IndexRow};

/// Above this share of busy CPU time during a run, the run measured the machine,
/// not the storage system.
pub const CPU_BOUND_BUSY: f64 = 0.90;

/// Bytes moved during a point, summed over its repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Traffic {
    /// Bytes clients wrote (write operations) or read (read operations).
    pub client_bytes: u64,
    /// Bytes nodes sent to other nodes (`drove_peer_sent_bytes_total`).
    pub peer_sent_bytes: u64,
    /// Bytes nodes received on connections they opened (`drove_peer_received_bytes_total`).
    pub peer_received_bytes: u64,
    /// The part of `peer_sent_bytes` sent to a node of another zone.
    pub cross_zone_sent_bytes: u64,
    /// The part of `peer_received_bytes` received from a node of another zone.
    pub cross_zone_received_bytes: u64,
    /// Baseline only: bytes its WAN proxies carried, both directions (toxiproxy's
    /// counters, which count a connection when it closes: each fio run closes its
    /// own). `None` for drove, whose peer connections stay open for the whole run.
    pub proxy_bytes: Option<u64>,
    /// Baseline only: bytes written or read by clients outside zone 1 (fio's counts),
    /// the WAN traffic computed from the clients' side.
    pub computed_wan_bytes: u64,
}

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct PointResult {
    /// System.
    pub system: System,
    /// Operation.
    pub op: Op,
    /// Clients at once.
    pub x: usize,
    /// One-way delay between zones, ms.
    pub delay_ms: u64,
    /// Median over repeats of the mean per-client throughput, MB/s (10^6 bytes).
    pub mean_mbps: f64,
    /// Per-client MB/s of the repeat nearest the median.
    pub per_client_mbps: Vec<f64>,
    /// Mean per-client MB/s of every repeat.
    pub repeat_mean_mbps: Vec<f64>,
    /// Sum over clients of the repeat nearest the median, MB/s.
    pub aggregate_mbps: f64,
    /// Highest machine CPU busy share over the repeats, percent.
    pub cpu_busy_pct: f64,
    /// Highest share of the machine's CPU used by the experiment's own processes
    /// over the repeats, percent.
    pub experiment_cpu_pct: f64,
    /// Whether a repeat ran with the machine more than 90% busy.
    pub cpu_bound: bool,
    /// Bytes moved.
    pub traffic: Traffic,
}

/// One repeat of a point: what each client did and how busy the machine was.
#[derive(Clone, Debug)]
pub struct RepeatSample {
    /// MB/s of each client.
    pub per_client_mbps: Vec<f64>,
    /// Busy share of the machine's CPU time during the repeat, 0..1.
    pub cpu_busy: f64,
    /// Share of the machine's CPU time used by the experiment's own processes
    /// (nodes, proxies, servers, fio), 0..1; the rest of `cpu_busy` is other load.
    pub own_cpu: f64,
}

impl PointResult {
    /// A point with no measurement yet.
    pub fn empty(system: System, op: Op, x: usize, delay_ms: u64) -> Self {
        PointResult {
            system,
            op,
            x,
            delay_ms,
            mean_mbps: 0.0,
            per_client_mbps: Vec::new(),
            repeat_mean_mbps: Vec::new(),
            aggregate_mbps: 0.0,
            cpu_busy_pct: 0.0,
            experiment_cpu_pct: 0.0,
            cpu_bound: false,
            traffic: Traffic::default(),
        }
    }

    /// Fold the repeats into the point: the median of the per-repeat means.
    pub fn from_repeats(
        system: System,
        op: Op,
        x: usize,
        delay_ms: u64,
        repeats: &[RepeatSample],
        traffic: Traffic,
    ) -> Self {
        let means: Vec<f64> = repeats
            .iter()
            .map(|r| mean(&r.per_client_mbps).unwrap_or(f64::NAN))
            .collect();
        let med = median(&means).unwrap_or(f64::NAN);
        let nearest = repeats
            .iter()
            .zip(&means)
            .min_by(|a, b| (a.1 - med).abs().total_cmp(&(b.1 - med).abs()))
            .map(|(r, _)| r.per_client_mbps.clone())
            .unwrap_or_default();
        let busy = repeats.iter().map(|r| r.cpu_busy).fold(0.0, f64::max);
        let own = repeats.iter().map(|r| r.own_cpu).fold(0.0, f64::max);
        PointResult {
            system,
            op,
            x,
            delay_ms,
            mean_mbps: med,
            aggregate_mbps: nearest.iter().sum(),
            per_client_mbps: nearest,
            repeat_mean_mbps: means,
            cpu_busy_pct: busy * 100.0,
            experiment_cpu_pct: own * 100.0,
            cpu_bound: busy > CPU_BOUND_BUSY,
            traffic,
        }
    }

    /// Bytes sent between nodes per byte clients wrote (write operations only).
    pub fn transfer_efficiency(&self) -> Option<f64> {
        if !self.op.is_write() || !self.system.is_drove() {
            return None;
        }
        crate::index::ratio(
            self.traffic.peer_sent_bytes as f64,
            self.traffic.client_bytes as f64,
        )
    }

    /// Bytes sent between nodes of different zones per byte clients wrote.
    pub fn cross_zone_efficiency(&self) -> Option<f64> {
        if !self.op.is_write() || !self.system.is_drove() {
            return None;
        }
        crate::index::ratio(
            self.traffic.cross_zone_sent_bytes as f64,
            self.traffic.client_bytes as f64,
        )
    }

    /// Bytes through the WAN proxies per byte clients moved (baseline).
    pub fn wan_bytes_per_client_byte(&self) -> Option<f64> {
        crate::index::ratio(
            self.traffic.proxy_bytes? as f64,
            self.traffic.client_bytes as f64,
        )
    }
}

/// The point of `system`, `op`, `x` and `delay_ms` among `points`, if measured.
pub fn find_point(
    points: &[PointResult],
    system: System,
    op: Op,
    x: usize,
    delay_ms: u64,
) -> Option<&PointResult> {
    points
        .iter()
        .find(|p| p.system == system && p.op == op && p.x == x && p.delay_ms == delay_ms)
}

/// Measured round trips of the delay check, ms.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DelayCheck {
    /// HTTP request/response to a node's admin port through a proxy, no toxic.
    pub rtt_no_delay_ms: f64,
    /// The same with the latency toxics in place.
    pub rtt_delay_ms: f64,
    /// NBD option request/reply through a baseline proxy with the toxics, if a
    /// baseline client is outside zone 1.
    pub baseline_rtt_delay_ms: Option<f64>,
    /// After the prefill: node connections to their WAN proxies.
    pub proxied_connections: usize,
    /// After the prefill: node connections straight to a node of another zone
    /// (must be 0; the run stops otherwise).
    pub direct_cross_zone_connections: usize,
    /// Cross-zone peer bytes the nodes counted over the whole run (sent + received).
    pub run_cross_zone_bytes: u64,
    /// Bytes drove's proxies carried over the whole run, read after the cluster
    /// stopped (toxiproxy counts a connection when it closes).
    pub run_proxy_bytes: u64,
}

/// Everything one run produced.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Every point.
    pub points: Vec<PointResult>,
    /// Every index.
    pub indexes: Vec<IndexRow>,
    /// The delay check.
    pub delay_check: DelayCheck,
    /// Output directory.
    pub out_dir: PathBuf,
    /// PNG charts written (empty when skipped).
    pub charts: Vec<PathBuf>,
    /// Why charts were skipped, if they were.
    pub charts_note: Option<String>,
    /// Wall-clock seconds of the whole run.
    pub elapsed_secs: f64,
}

/// results.csv's header.
pub const CSV_HEADER: &str = "system,op,x,delay_ms,mean_per_client_mbps,aggregate_mbps,\
min_client_mbps,max_client_mbps,per_client_mbps,repeat_means_mbps,cpu_busy_pct,experiment_cpu_pct,cpu_bound,\
client_bytes,peer_sent_bytes,peer_received_bytes,cross_zone_sent_bytes,\
cross_zone_received_bytes,proxy_bytes,computed_wan_bytes";

fn join(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// `header` (comma-separated names) and `rows` as CSV text, fields quoted where
/// they need it (the csv crate).
fn to_csv(header: &str, rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    // Writing into memory fails only if a row has another length than the header,
    // which the callers below never make.
    let _ = w.write_record(header.split(','));
    for r in rows {
        let _ = w.write_record(&r);
    }
    w.into_inner()
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

/// results.csv: one row per point; lists inside a field are `;`-separated.
pub fn points_csv(points: &[PointResult]) -> String {
    to_csv(
        CSV_HEADER,
        points.iter().map(|p| {
            let min = p
                .per_client_mbps
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min);
            let max = p.per_client_mbps.iter().copied().fold(0.0, f64::max);
            let t = &p.traffic;
            let mbps = |v: f64| format!("{v:.3}");
            vec![
                p.system.name().to_string(),
                p.op.name().to_string(),
                p.x.to_string(),
                p.delay_ms.to_string(),
                mbps(p.mean_mbps),
                mbps(p.aggregate_mbps),
                mbps(if min.is_finite() { min } else { 0.0 }),
                mbps(max),
                join(&p.per_client_mbps),
                join(&p.repeat_mean_mbps),
                format!("{:.1}", p.cpu_busy_pct),
                format!("{:.1}", p.experiment_cpu_pct),
                p.cpu_bound.to_string(),
                t.client_bytes.to_string(),
                t.peer_sent_bytes.to_string(),
                t.peer_received_bytes.to_string(),
                t.cross_zone_sent_bytes.to_string(),
                t.cross_zone_received_bytes.to_string(),
                t.proxy_bytes.map_or("n/a".to_string(), |b| b.to_string()),
                t.computed_wan_bytes.to_string(),
            ]
        }),
    )
}

/// indexes.csv: one row per index; `n/a` where it cannot be computed.
pub fn indexes_csv(rows: &[IndexRow]) -> String {
    to_csv(
        "index,system,op,x,delay_ms,value,cpu_bound",
        rows.iter().map(|r| {
            vec![
                r.kind.name().to_string(),
                r.system.name().to_string(),
                r.op.name().to_string(),
                r.x.to_string(),
                r.delay_ms.to_string(),
                r.value.map_or("n/a".to_string(), |v| format!("{v:.4}")),
                r.cpu_bound.to_string(),
            ]
        }),
    )
}

/// Write `text` to `path`.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("Cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(v: &[f64], busy: f64) -> RepeatSample {
        RepeatSample {
            per_client_mbps: v.to_vec(),
            cpu_busy: busy,
            own_cpu: busy / 2.0,
        }
    }

    #[test]
    fn test_point_keeps_the_median_repeat() {
        let reps = [
            sample(&[10.0, 30.0], 0.5),  // mean 20
            sample(&[100.0, 0.0], 0.95), // mean 50
            sample(&[5.0, 5.0], 0.2),    // mean 5
        ];
        let p = PointResult::from_repeats(
            System::Drove,
            Op::SmallRead,
            2,
            10,
            &reps,
            Traffic::default(),
        );
        assert_eq!(p.mean_mbps, 20.0);
        assert_eq!(p.per_client_mbps, vec![10.0, 30.0]);
        assert_eq!(p.aggregate_mbps, 40.0);
        assert_eq!(p.repeat_mean_mbps, vec![20.0, 50.0, 5.0]);
        assert!(p.cpu_bound, "one repeat ran at 95% busy");
        assert!((p.cpu_busy_pct - 95.0).abs() < 1e-9);
        assert!((p.experiment_cpu_pct - 47.5).abs() < 1e-9);
    }

    #[test]
    fn test_csv_has_one_well_formed_row_per_point() {
        let mut p = PointResult::from_repeats(
            System::Baseline,
            Op::BlockWrite,
            4,
            0,
            &[sample(&[1.5, 2.5, 3.0, 1.0], 0.3)],
            Traffic {
                client_bytes: 1000,
                proxy_bytes: Some(760),
                computed_wan_bytes: 750,
                ..Traffic::default()
            },
        );
        p.traffic.peer_sent_bytes = 0;
        let csv = points_csv(&[p.clone(), p]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        let cols = CSV_HEADER.split(',').count();
        assert_eq!(cols, 20);
        let row: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(row.len(), cols, "{}", lines[1]);
        assert_eq!(&row[..4], &["baseline", "block-write", "4", "0"]);
        assert_eq!(row[4], "2.000");
        assert_eq!(row[5], "8.000");
        assert_eq!(row[6], "1.000");
        assert_eq!(row[7], "3.000");
        assert_eq!(row[8], "1.500;2.500;3.000;1.000");
        assert_eq!(row[10], "30.0");
        assert_eq!(row[11], "15.0");
        assert_eq!(row[12], "false");
        assert_eq!(row[13], "1000");
        assert_eq!(row[18], "760");
    }

    #[test]
    fn test_efficiency_only_for_drove_writes() {
        let mut p = PointResult::empty(System::Drove, Op::BlockWrite, 1, 0);
        p.traffic.client_bytes = 100;
        p.traffic.peer_sent_bytes = 300;
        p.traffic.cross_zone_sent_bytes = 200;
        assert_eq!(p.transfer_efficiency(), Some(3.0));
        assert_eq!(p.cross_zone_efficiency(), Some(2.0));
        p.traffic.client_bytes = 0;
        assert_eq!(p.transfer_efficiency(), None);
        let r = PointResult::empty(System::Drove, Op::BlockRead, 1, 0);
        assert_eq!(r.transfer_efficiency(), None);
        // zone-sync is drove too; the baseline has no nodes to count.
        let mut z = PointResult::empty(System::DroveZoneSync, Op::SmallWrite, 2, 10);
        z.traffic.client_bytes = 100;
        z.traffic.peer_sent_bytes = 250;
        z.traffic.cross_zone_sent_bytes = 100;
        assert_eq!(z.transfer_efficiency(), Some(2.5));
        assert_eq!(z.cross_zone_efficiency(), Some(1.0));
        let mut b = PointResult::empty(System::Baseline, Op::SmallWrite, 2, 10);
        b.traffic.client_bytes = 100;
        b.traffic.peer_sent_bytes = 250;
        assert_eq!(b.transfer_efficiency(), None);
        assert_eq!(b.cross_zone_efficiency(), None);
    }

    #[test]
    fn test_csv_fields_are_quoted_where_they_need_it() {
        let rows = vec![vec!["x,y".to_string(), "say \"hi\"".to_string()]];
        assert_eq!(to_csv("a,b", rows), "a,b\n\"x,y\",\"say \"\"hi\"\"\"\n");
    }

    #[test]
    fn test_csv_names_every_system() {
        let pts: Vec<PointResult> = System::ALL
            .into_iter()
            .map(|s| PointResult::empty(s, Op::BlockWrite, 1, 0))
            .collect();
        let csv = points_csv(&pts);
        let names: Vec<&str> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap_or(""))
            .collect();
        assert_eq!(names, vec!["drove", "drove-zone-sync", "baseline"]);
        for n in names {
            assert!(System::parse(n).is_some(), "{n}");
        }
    }
}
