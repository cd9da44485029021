//! The paper's two indexes and the arithmetic under them (median, mean, ratio).
//!
//! ParallelismImpactRatio(op, X, delay) = mean per-client throughput with X clients
//! at once / the same with one client (same delay). LatencyImpactRatio(op, X) =
//! throughput with the delay / without it (same X). A ratio whose denominator is
//! zero or missing is `None` and is shown as "n/a", never as infinity or 0.
use serde::Serialize;

use crate::config::{Op, System};
use crate::results::{find_point, PointResult};

/// `num / den`, or `None` when it has no meaning (missing, negative, zero or
/// non-finite denominator).
pub fn ratio(num: f64, den: f64) -> Option<f64> {
    if !num.is_finite() || !den.is_finite() || num < 0.0 || den <= 0.0 {
        return None;
    }
    Some(num / den)
}

/// Median of `v`; `None` when empty or when a value is not finite.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Arithmetic mean of `v`; `None` when empty or when a value is not finite.
pub fn mean(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    Some(v.iter().sum::<f64>() / v.len() as f64)
}

/// ParallelismImpactRatio from the mean per-client throughput at X and at X=1.
pub fn parallelism_impact_ratio(at_x: Option<f64>, at_one: Option<f64>) -> Option<f64> {
    ratio(at_x?, at_one?)
}

/// LatencyImpactRatio from the throughput with and without the delay.
pub fn latency_impact_ratio(with_delay: Option<f64>, without: Option<f64>) -> Option<f64> {
    ratio(with_delay?, without?)
}

/// A ratio for a table: two decimals, or "n/a".
pub fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(v) => format!("{v:.2}"),
        None => "n/a".to_string(),
    }
}

/// Which index a row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IndexKind {
    /// ParallelismImpactRatio.
    Parallelism,
    /// LatencyImpactRatio.
    Latency,
}

impl IndexKind {
    /// Name in files.
    pub fn name(self) -> &'static str {
        match self {
            IndexKind::Parallelism => "parallelism",
            IndexKind::Latency => "latency",
        }
    }
}

/// One computed index value.
#[derive(Clone, Debug, Serialize)]
pub struct IndexRow {
    /// Which index.
    pub kind: IndexKind,
    /// System.
    pub system: System,
    /// Operation.
    pub op: Op,
    /// Clients at once.
    pub x: usize,
    /// Parallelism: the delay of both points; latency: the delay compared with 0.
    pub delay_ms: u64,
    /// The ratio, `None` when it cannot be computed.
    pub value: Option<f64>,
    /// Whether one of the two points divided was CPU-bound.
    pub cpu_bound: bool,
}

/// Every index of each of `systems`, every operation and X, from the measured
/// points.
pub fn compute_indexes(
    points: &[PointResult],
    systems: &[System],
    parallel: &[usize],
    delay_ms: u64,
) -> Vec<IndexRow> {
    let mut out = Vec::new();
    for &system in systems {
        for op in Op::ALL {
            for &x in parallel {
                for delay in [0, delay_ms] {
                    let px = find_point(points, system, op, x, delay);
                    let p1 = find_point(points, system, op, 1, delay);
                    out.push(IndexRow {
                        kind: IndexKind::Parallelism,
                        system,
                        op,
                        x,
                        delay_ms: delay,
                        value: parallelism_impact_ratio(
                            px.map(|p| p.mean_mbps),
                            p1.map(|p| p.mean_mbps),
                        ),
                        cpu_bound: px.is_some_and(|p| p.cpu_bound)
                            || p1.is_some_and(|p| p.cpu_bound),
                    });
                }
                let pd = find_point(points, system, op, x, delay_ms);
                let p0 = find_point(points, system, op, x, 0);
                out.push(IndexRow {
                    kind: IndexKind::Latency,
                    system,
                    op,
                    x,
                    delay_ms,
                    value: latency_impact_ratio(pd.map(|p| p.mean_mbps), p0.map(|p| p.mean_mbps)),
                    cpu_bound: pd.is_some_and(|p| p.cpu_bound) || p0.is_some_and(|p| p.cpu_bound),
                });
            }
        }
    }
    out
}

/// The value of one index, if it was computed.
pub fn lookup(
    rows: &[IndexRow],
    kind: IndexKind,
    system: System,
    op: Op,
    x: usize,
    delay_ms: u64,
) -> Option<&IndexRow> {
    rows.iter().find(|r| {
        r.kind == kind && r.system == system && r.op == op && r.x == x && r.delay_ms == delay_ms
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ratio_handles_zero_and_nan() {
        assert_eq!(ratio(6.0, 3.0), Some(2.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 2.0), None);
        assert_eq!(ratio(1.0, f64::INFINITY), None);
        assert_eq!(ratio(0.0, 5.0), Some(0.0));
        assert_eq!(fmt_ratio(ratio(1.0, 0.0)), "n/a");
        assert_eq!(fmt_ratio(Some(0.456)), "0.46");
    }

    #[test]
    fn test_median_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
        assert_eq!(mean(&[]), None);
    }

    #[test]
    fn test_index_ratios_from_throughputs() {
        // 4 clients at 25 MB/s each against one at 100 MB/s: the parallel run
        // keeps a quarter of the single-client throughput per client.
        assert_eq!(
            parallelism_impact_ratio(Some(25.0), Some(100.0)),
            Some(0.25)
        );
        assert_eq!(parallelism_impact_ratio(Some(25.0), None), None);
        assert_eq!(parallelism_impact_ratio(Some(25.0), Some(0.0)), None);
        assert_eq!(latency_impact_ratio(Some(10.0), Some(40.0)), Some(0.25));
        assert_eq!(latency_impact_ratio(None, Some(40.0)), None);
    }

    fn point(system: System, op: Op, x: usize, delay_ms: u64, mbps: f64) -> PointResult {
        PointResult {
            system,
            op,
            x,
            delay_ms,
            mean_mbps: mbps,
            cpu_bound: mbps > 99.0,
            ..PointResult::empty(system, op, x, delay_ms)
        }
    }

    #[test]
    fn test_compute_indexes_divides_the_right_points() {
        let pts = vec![
            point(System::Drove, Op::BlockWrite, 1, 0, 100.0),
            point(System::Drove, Op::BlockWrite, 4, 0, 50.0),
            point(System::Drove, Op::BlockWrite, 1, 10, 20.0),
            point(System::Drove, Op::BlockWrite, 4, 10, 0.0),
        ];
        let rows = compute_indexes(&pts, &[System::Drove, System::Baseline], &[1, 4], 10);
        let get = |k, x, d| {
            lookup(&rows, k, System::Drove, Op::BlockWrite, x, d)
                .unwrap()
                .clone()
        };
        assert_eq!(get(IndexKind::Parallelism, 4, 0).value, Some(0.5));
        assert_eq!(get(IndexKind::Parallelism, 1, 0).value, Some(1.0));
        assert_eq!(get(IndexKind::Parallelism, 4, 10).value, Some(0.0));
        assert!(
            get(IndexKind::Parallelism, 4, 0).cpu_bound,
            "X=1 at 100 MB/s is CPU-bound"
        );
        assert_eq!(get(IndexKind::Latency, 1, 10).value, Some(0.2));
        assert_eq!(get(IndexKind::Latency, 4, 10).value, Some(0.0));
        // The baseline was not measured: every index is n/a, not 0.
        let b = lookup(
            &rows,
            IndexKind::Latency,
            System::Baseline,
            Op::BlockWrite,
            4,
            10,
        )
        .unwrap();
        assert_eq!(b.value, None);
        assert_eq!(rows.len(), 2 * 4 * 2 * 3);
    }

    #[test]
    fn test_compute_indexes_keeps_the_systems_apart() {
        // Same operation, X and delay: each system's index comes from its own points.
        let pts = vec![
            point(System::Drove, Op::SmallWrite, 1, 0, 40.0),
            point(System::Drove, Op::SmallWrite, 1, 10, 2.0),
            point(System::DroveZoneSync, Op::SmallWrite, 1, 0, 40.0),
            point(System::DroveZoneSync, Op::SmallWrite, 1, 10, 36.0),
            point(System::Baseline, Op::SmallWrite, 1, 0, 20.0),
            point(System::Baseline, Op::SmallWrite, 1, 10, 10.0),
        ];
        let rows = compute_indexes(&pts, &System::ALL, &[1], 10);
        let lat = |s| {
            lookup(&rows, IndexKind::Latency, s, Op::SmallWrite, 1, 10)
                .unwrap()
                .value
        };
        assert_eq!(lat(System::Drove), Some(0.05));
        assert_eq!(lat(System::DroveZoneSync), Some(0.9));
        assert_eq!(lat(System::Baseline), Some(0.5));
        assert_eq!(rows.len(), 3 * 4 * 3);
        // Only the systems asked for get rows.
        let rows = compute_indexes(&pts, &[System::DroveZoneSync, System::Baseline], &[1], 10);
        assert!(rows.iter().all(|r| r.system != System::Drove));
    }
}
