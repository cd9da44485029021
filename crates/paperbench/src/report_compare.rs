//! The tables of results.md that put every drove system (one per write policy)
//! beside the baseline: throughput per client, the two indexes with a "drove >=
//! baseline" column per drove system, the targets met, and throughput by the
//! client's zone. One column per system, in the run's order, so a run with one
//! policy and a run with both read the same way.
use std::fmt::Write as _;

use crate::config::{Op, PaperConfig, System};
use crate::index::{fmt_ratio, lookup, ratio, IndexKind, IndexRow};
use crate::results::{find_point, PointResult};

/// A markdown table row from its cells.
pub fn table_row(s: &mut String, cells: &[String]) {
    let _ = writeln!(s, "| {} |", cells.join(" | "));
}

/// A markdown table header and its separator line.
pub fn table_head(s: &mut String, cells: &[String]) {
    table_row(s, cells);
    let _ = writeln!(s, "|{}", "---|".repeat(cells.len()));
}

/// The first cells of a row: operation and X (and the delay if given).
fn lead(op: Op, x: usize, delay: Option<u64>) -> Vec<String> {
    let mut v = vec![op.name().to_string(), x.to_string()];
    v.extend(delay.map(|d| d.to_string()));
    v
}

fn heads(fixed: &[&str]) -> Vec<String> {
    fixed.iter().map(|c| c.to_string()).collect()
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

/// Compare drove system `drove`'s index with the baseline's: `Some(true)` when
/// drove's is at least as high, `None` when either is n/a.
pub fn at_least(
    rows: &[IndexRow],
    k: IndexKind,
    drove: System,
    op: Op,
    x: usize,
    d: u64,
) -> Option<bool> {
    let a = lookup(rows, k, drove, op, x, d)?.value?;
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

/// Cases where a drove system's index is at least the baseline's: (met, compared).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Met {
    /// Cases where drove's index is at least the baseline's.
    pub met: usize,
    /// Cases where both indexes exist.
    pub compared: usize,
}

impl Met {
    fn add(&mut self, m: Option<bool>) {
        self.compared += usize::from(m.is_some());
        self.met += usize::from(m == Some(true));
    }
}

/// "Throughput per client": every system's mean per-client MB/s, then each drove
/// system's over the baseline's.
pub fn throughput_section(s: &mut String, cfg: &PaperConfig, pts: &[PointResult]) {
    let systems = cfg.systems();
    let droves = cfg.drove_systems();
    let _ = writeln!(s, "## Throughput per client (MB/s)\n");
    let mut head = heads(&["op", "X", "delay ms"]);
    head.extend(systems.iter().map(|x| x.label().to_string()));
    head.extend(droves.iter().map(|x| format!("{} / baseline", x.label())));
    table_head(s, &head);
    for delay in cfg.delays() {
        for op in Op::ALL {
            for &x in &cfg.parallel {
                let mut cells = lead(op, x, Some(delay));
                cells.extend(
                    systems
                        .iter()
                        .map(|&sy| mbps(find_point(pts, sy, op, x, delay))),
                );
                let base = find_point(pts, System::Baseline, op, x, delay);
                for &sy in &droves {
                    let a = find_point(pts, sy, op, x, delay);
                    cells.push(fmt_ratio(ratio(
                        a.map_or(f64::NAN, |p| p.mean_mbps),
                        base.map_or(f64::NAN, |p| p.mean_mbps),
                    )));
                }
                table_row(s, &cells);
            }
        }
    }
}

/// "ParallelismImpactRatio": every system at both delays, then per drove system
/// whether it is at least the baseline (`yes / no` = no delay / delay). Returns
/// the cases met per drove system, X > 1 only (at X = 1 every ratio is 1).
pub fn parallelism_section(s: &mut String, cfg: &PaperConfig, rows: &[IndexRow]) -> Vec<Met> {
    let systems = cfg.systems();
    let droves = cfg.drove_systems();
    let k = IndexKind::Parallelism;
    let _ = writeln!(s, "\n## ParallelismImpactRatio\n");
    let _ = writeln!(
        s,
        "Mean per-client throughput with X clients at once / with one client, same delay.\n"
    );
    let mut head = heads(&["op", "X"]);
    for delay in cfg.delays() {
        head.extend(systems.iter().map(|x| format!("{} {delay} ms", x.label())));
    }
    head.extend(droves.iter().map(|x| format!("{} >= baseline", x.label())));
    table_head(s, &head);
    let mut met = vec![Met::default(); droves.len()];
    for op in Op::ALL {
        for &x in &cfg.parallel {
            let mut cells = lead(op, x, None);
            for delay in cfg.delays() {
                cells.extend(systems.iter().map(|&sy| idx(rows, k, sy, op, x, delay)));
            }
            for (m, &sy) in met.iter_mut().zip(&droves) {
                if x == 1 {
                    cells.push("-".to_string());
                    continue;
                }
                let mut shown = Vec::new();
                for d in cfg.delays() {
                    let v = at_least(rows, k, sy, op, x, d);
                    m.add(v);
                    shown.push(yes_no(v));
                }
                cells.push(shown.join(" / "));
            }
            table_row(s, &cells);
        }
    }
    met
}

/// "LatencyImpactRatio": every system, then per drove system whether it is at
/// least the baseline. Returns the cases met per drove system.
pub fn latency_section(s: &mut String, cfg: &PaperConfig, rows: &[IndexRow]) -> Vec<Met> {
    let systems = cfg.systems();
    let droves = cfg.drove_systems();
    let d = cfg.delay_ms;
    let k = IndexKind::Latency;
    let _ = writeln!(s, "\n## LatencyImpactRatio\n");
    let _ = writeln!(
        s,
        "Throughput with {d} ms one-way delay between zones / with none, same X.\n"
    );
    let mut head = heads(&["op", "X"]);
    head.extend(systems.iter().map(|x| x.label().to_string()));
    head.extend(droves.iter().map(|x| format!("{} >= baseline", x.label())));
    table_head(s, &head);
    let mut met = vec![Met::default(); droves.len()];
    for op in Op::ALL {
        for &x in &cfg.parallel {
            let mut cells = lead(op, x, None);
            cells.extend(systems.iter().map(|&sy| idx(rows, k, sy, op, x, d)));
            for (m, &sy) in met.iter_mut().zip(&droves) {
                let v = at_least(rows, k, sy, op, x, d);
                m.add(v);
                cells.push(yes_no(v).to_string());
            }
            table_row(s, &cells);
        }
    }
    met
}

/// "Targets": per drove system, how many cases have its index at least the
/// baseline's.
pub fn targets_section(s: &mut String, cfg: &PaperConfig, par: &[Met], lat: &[Met]) {
    let _ = writeln!(s, "\n## Targets\n");
    for ((sy, p), l) in cfg.drove_systems().into_iter().zip(par).zip(lat) {
        let _ = writeln!(
            s,
            "- {}: LatencyImpactRatio >= the baseline's in {} of {} (operation, X) cases; \
             ParallelismImpactRatio >= the baseline's (X > 1, both delays) in {} of {} cases.",
            sy.label(),
            l.met,
            l.compared,
            p.met,
            p.compared
        );
    }
    s.push('\n');
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

/// "Per-client throughput by zone": zone 1 and the other zones, per system.
pub fn zone_section(s: &mut String, cfg: &PaperConfig, pts: &[PointResult]) {
    let systems = cfg.systems();
    let _ = writeln!(s, "## Per-client throughput by zone (MB/s)\n");
    let _ = writeln!(
        s,
        "The mean per client hides where the clients are: the baseline's server is in zone 1. \
         Zone 1 = clients in the baseline server's zone; other = clients in the other zones.\n"
    );
    let mut head = heads(&["op", "X", "delay ms"]);
    for sy in &systems {
        head.push(format!("{} zone 1", sy.label()));
        head.push(format!("{} other zones", sy.label()));
    }
    table_head(s, &head);
    for delay in cfg.delays() {
        for op in Op::ALL {
            for &x in cfg.parallel.iter().filter(|&&x| x > 1) {
                let found: Vec<Option<&PointResult>> = systems
                    .iter()
                    .map(|&sy| find_point(pts, sy, op, x, delay))
                    .collect();
                if found.iter().all(Option::is_none) {
                    continue;
                }
                let mut cells = lead(op, x, Some(delay));
                for p in found {
                    let (z1, other) = p.map_or((None, None), |p| zone_split(p, cfg.zones));
                    cells.push(opt_mbps(z1));
                    cells.push(opt_mbps(other));
                }
                table_row(s, &cells);
            }
        }
    }
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::compute_indexes;
    use drove_types::WritePolicy;

    #[test]
    fn test_zone_split_follows_client_placement() {
        let mut p = PointResult::empty(System::Baseline, Op::SmallRead, 5, 10);
        // 4 zones: clients 0 and 4 are in zone 1.
        p.per_client_mbps = vec![10.0, 1.0, 2.0, 3.0, 20.0];
        assert_eq!(zone_split(&p, 4), (Some(15.0), Some(2.0)));
        p.per_client_mbps = vec![10.0];
        assert_eq!(zone_split(&p, 4), (Some(10.0), None));
    }

    fn point(system: System, op: Op, x: usize, delay_ms: u64, mbps: f64) -> PointResult {
        let mut p = PointResult::empty(system, op, x, delay_ms);
        p.mean_mbps = mbps;
        p.per_client_mbps = vec![mbps; x];
        p
    }

    /// Small writes at X = 1, 2 and 0 / 10 ms: sync loses most of its throughput
    /// to the delay, zone-sync little, the baseline half.
    fn small_writes() -> Vec<PointResult> {
        let mut v = Vec::new();
        for (sy, [a, b, c, d]) in [
            (System::Drove, [40.0, 20.0, 2.0, 1.0]),
            (System::DroveZoneSync, [40.0, 30.0, 36.0, 27.0]),
            (System::Baseline, [20.0, 10.0, 10.0, 5.0]),
        ] {
            v.push(point(sy, Op::SmallWrite, 1, 0, a));
            v.push(point(sy, Op::SmallWrite, 2, 0, b));
            v.push(point(sy, Op::SmallWrite, 1, 10, c));
            v.push(point(sy, Op::SmallWrite, 2, 10, d));
        }
        v
    }

    fn row_of<'a>(table: &'a str, prefix: &str) -> Vec<&'a str> {
        let line = table
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row '{prefix}' in\n{table}"));
        line.trim_matches('|').split('|').map(str::trim).collect()
    }

    #[test]
    fn test_throughput_table_has_every_drove_system_and_the_baseline() {
        let cfg = PaperConfig::example(vec![WritePolicy::Sync, WritePolicy::ZoneSync]);
        let mut s = String::new();
        throughput_section(&mut s, &cfg, &small_writes());
        let head = row_of(&s, "| op |");
        assert_eq!(
            head,
            [
                "op",
                "X",
                "delay ms",
                "drove sync",
                "drove zone-sync",
                "baseline",
                "drove sync / baseline",
                "drove zone-sync / baseline"
            ]
        );
        assert!(
            s.contains(&format!("|{}\n", "---|".repeat(head.len()))),
            "{s}"
        );
        assert_eq!(
            row_of(&s, "| small-write | 1 | 10 |"),
            [
                "small-write",
                "1",
                "10",
                "2.00",
                "36.00",
                "10.00",
                "0.20",
                "3.60"
            ]
        );
        // Operations not measured are n/a, not 0.
        assert_eq!(
            row_of(&s, "| block-read | 2 | 0 |")[3..],
            ["n/a", "n/a", "n/a", "n/a", "n/a"]
        );
        // 2 delays x 4 operations x 2 X, the header and its separator.
        assert_eq!(s.lines().filter(|l| l.starts_with('|')).count(), 16 + 2);
    }

    #[test]
    fn test_index_tables_compare_each_drove_system_with_the_baseline() {
        let cfg = PaperConfig::example(vec![WritePolicy::Sync, WritePolicy::ZoneSync]);
        let rows = compute_indexes(&small_writes(), &cfg.systems(), &cfg.parallel, 10);
        let mut s = String::new();
        let par = parallelism_section(&mut s, &cfg, &rows);
        assert_eq!(
            row_of(&s, "| op |")[2..],
            [
                "drove sync 0 ms",
                "drove zone-sync 0 ms",
                "baseline 0 ms",
                "drove sync 10 ms",
                "drove zone-sync 10 ms",
                "baseline 10 ms",
                "drove sync >= baseline",
                "drove zone-sync >= baseline"
            ]
        );
        // Parallelism at X = 2: sync 0.50 / 1.00, zone-sync 0.75 / 0.75, baseline
        // 0.50 / 0.50.
        assert_eq!(
            row_of(&s, "| small-write | 2 |")[2..],
            [
                "0.50",
                "0.75",
                "0.50",
                "0.50",
                "0.75",
                "0.50",
                "yes / yes",
                "yes / yes"
            ]
        );
        assert_eq!(row_of(&s, "| small-write | 1 |")[8..], ["-", "-"]);
        assert_eq!(
            par,
            vec![
                Met {
                    met: 2,
                    compared: 2
                };
                2
            ]
        );

        let mut s = String::new();
        let lat = latency_section(&mut s, &cfg, &rows);
        // Latency at X = 1: sync 0.05, zone-sync 0.90, baseline 0.50.
        assert_eq!(
            row_of(&s, "| small-write | 1 |")[2..],
            ["0.05", "0.90", "0.50", "**no**", "yes"]
        );
        assert_eq!(row_of(&s, "| block-write | 1 |")[5..], ["n/a", "n/a"]);
        assert_eq!(
            lat,
            vec![
                Met {
                    met: 0,
                    compared: 2
                },
                Met {
                    met: 2,
                    compared: 2
                }
            ]
        );

        let mut s = String::new();
        targets_section(&mut s, &cfg, &par, &lat);
        assert!(
            s.contains("- drove sync: LatencyImpactRatio >= the baseline's in 0 of 2"),
            "{s}"
        );
        assert!(
            s.contains("- drove zone-sync: LatencyImpactRatio >= the baseline's in 2 of 2"),
            "{s}"
        );
    }

    #[test]
    fn test_one_policy_keeps_the_old_column_positions() {
        // e2e_bench reads cells 2 and 5 (parallelism) and 2 and 3 (latency).
        let cfg = PaperConfig::example(vec![WritePolicy::ZoneSync]);
        let rows = compute_indexes(&small_writes(), &cfg.systems(), &cfg.parallel, 10);
        let mut s = String::new();
        parallelism_section(&mut s, &cfg, &rows);
        let r = row_of(&s, "| small-write | 2 |");
        assert_eq!(r.len(), 7);
        assert_eq!((r[2], r[5]), ("0.75", "0.50"));
        let mut s = String::new();
        latency_section(&mut s, &cfg, &rows);
        assert_eq!(
            row_of(&s, "| small-write | 2 |")[2..],
            ["0.90", "0.50", "yes"]
        );
        assert!(!s.contains("drove sync"), "{s}");
    }

    #[test]
    fn test_zone_table_has_both_zones_of_every_system() {
        let cfg = PaperConfig::example(vec![WritePolicy::Sync, WritePolicy::ZoneSync]);
        let mut s = String::new();
        zone_section(&mut s, &cfg, &small_writes());
        assert_eq!(row_of(&s, "| op |").len(), 3 + 2 * 3);
        assert!(s.contains("drove zone-sync other zones"), "{s}");
        assert_eq!(
            row_of(&s, "| small-write | 2 | 10 |")[3..],
            ["1.00", "1.00", "27.00", "27.00", "5.00", "5.00"]
        );
        // Only X > 1 rows with a measured point.
        assert_eq!(s.lines().filter(|l| l.starts_with("| small")).count(), 2);
    }
}
