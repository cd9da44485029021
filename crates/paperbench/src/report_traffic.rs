//! The transfer-efficiency part of results.md: bytes moved in the background per
//! byte the clients wrote (the paper's future work), for each drove system from the
//! nodes' counters and, for the baseline, the bytes that crossed its WAN proxies.
//! One group of columns per drove system, then the baseline's.
use std::fmt::Write as _;

use crate::config::{Op, PaperConfig, System};
use crate::index::{fmt_ratio, ratio};
use crate::report_compare::{table_head, table_row};
use crate::results::{find_point, PointResult};

fn mb(p: Option<&PointResult>) -> String {
    p.map_or("n/a".to_string(), |p| {
        format!("{:.1}", p.traffic.client_bytes as f64 / 1e6)
    })
}

/// `f` of the point, or n/a when it was not measured.
fn cell(p: Option<&PointResult>, f: impl Fn(&PointResult) -> Option<f64>) -> String {
    fmt_ratio(p.and_then(f))
}

fn per_client_byte(bytes: u64, p: &PointResult) -> Option<f64> {
    ratio(bytes as f64, p.traffic.client_bytes as f64)
}

/// The baseline's WAN bytes per client byte: measured at its proxies, and
/// computed from what its clients outside zone 1 moved.
fn baseline_cells(b: Option<&PointResult>) -> [String; 2] {
    [
        cell(b, PointResult::wan_bytes_per_client_byte),
        cell(b, |p| per_client_byte(p.traffic.computed_wan_bytes, p)),
    ]
}

/// A column of a drove system: its heading and the ratio it shows.
type Column = (String, fn(&PointResult) -> Option<f64>);

/// One table: rows of (delay, op, X) for the operations `ops`; per drove system
/// the MB moved and two ratios (`drove`), then the baseline's columns.
fn table(
    s: &mut String,
    cfg: &PaperConfig,
    pts: &[PointResult],
    write: bool,
    drove: &[Column],
    baseline_heads: &[String],
) {
    let droves = cfg.drove_systems();
    let mut head: Vec<String> = ["op", "X", "delay ms"].map(String::from).to_vec();
    let verb = if write { "written" } else { "read" };
    for sy in &droves {
        head.push(format!("MB {verb} ({})", sy.label()));
        head.extend(drove.iter().map(|(h, _)| format!("{} {h}", sy.label())));
    }
    head.extend(baseline_heads.iter().cloned());
    table_head(s, &head);
    for delay in cfg.delays() {
        for op in Op::ALL.into_iter().filter(|o| o.is_write() == write) {
            for &x in &cfg.parallel {
                let b = find_point(pts, System::Baseline, op, x, delay);
                let found: Vec<Option<&PointResult>> = droves
                    .iter()
                    .map(|&sy| find_point(pts, sy, op, x, delay))
                    .collect();
                if b.is_none() && found.iter().all(Option::is_none) {
                    continue;
                }
                let mut cells = vec![op.name().to_string(), x.to_string(), delay.to_string()];
                for a in found {
                    cells.push(mb(a));
                    cells.extend(drove.iter().map(|(_, f)| cell(a, f)));
                }
                if write {
                    cells.push(mb(b));
                }
                cells.extend(baseline_cells(b));
                table_row(s, &cells);
            }
        }
    }
}

/// The transfer-efficiency and read-traffic sections.
pub fn traffic_sections(cfg: &PaperConfig, pts: &[PointResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Transfer efficiency (writes)\n");
    let _ = writeln!(
        s,
        "drove (each write policy): bytes sent between nodes / bytes clients wrote = sum over \
         nodes of `drove_peer_sent_bytes_total` deltas / sum of \
         `drove_nbd_bytes_total{{op=\"write\"}}` deltas; the cross-zone part counts only peers \
         in another zone of the cluster map (what crosses drove's WAN). The drove systems share \
         one cluster and run one at a time, and the counters are read when the clients exit: \
         bytes a zone-sync VDI ships after that are not in its point (those still moving when \
         the next drove point starts are counted there). The baseline has one \
         server and no replication (0 bytes between nodes); its WAN traffic is what its \
         clients outside zone 1 exchange with it: \"measured\" = bytes through its toxiproxy \
         proxies, both directions (`toxiproxy_proxy_received_bytes_total`, NBD headers \
         included), \"computed\" = bytes written by clients outside zone 1 (fio's `io_bytes`, \
         payload only). Sums over the repeats of the point.\n"
    );
    let wan = |kind: &str, verb: &str| format!("baseline WAN {kind} / {verb}");
    table(
        &mut s,
        cfg,
        pts,
        true,
        &[
            (
                "node bytes / written".to_string(),
                PointResult::transfer_efficiency,
            ),
            (
                "cross-zone (WAN) / written".to_string(),
                PointResult::cross_zone_efficiency,
            ),
        ],
        &[
            "MB written (baseline)".to_string(),
            wan("measured", "written"),
            wan("computed", "written"),
        ],
    );
    let _ = writeln!(s, "\n## Reads: bytes between nodes per byte read\n");
    let _ = writeln!(
        s,
        "drove: bytes nodes received from other nodes (`drove_peer_received_bytes_total`, \
         counted by the node that asked) / bytes clients read; this shows how much of a read \
         crosses zones. Baseline as above.\n"
    );
    table(
        &mut s,
        cfg,
        pts,
        false,
        &[
            ("node bytes / read".to_string(), |p| {
                per_client_byte(p.traffic.peer_received_bytes, p)
            }),
            ("cross-zone (WAN) / read".to_string(), |p| {
                per_client_byte(p.traffic.cross_zone_received_bytes, p)
            }),
        ],
        &[wan("measured", "read"), wan("computed", "read")],
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Traffic;
    use drove_types::WritePolicy;

    fn cells<'a>(md: &'a str, prefix: &str) -> Vec<&'a str> {
        md.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row '{prefix}' in\n{md}"))
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect()
    }

    #[test]
    fn test_write_table_has_each_drove_system_then_the_baseline() {
        let cfg = PaperConfig::example(vec![WritePolicy::Sync, WritePolicy::ZoneSync]);
        let point = |system, traffic| PointResult {
            traffic,
            ..PointResult::empty(system, Op::BlockWrite, 2, 10)
        };
        let pts = vec![
            // sync: 3 copies, 2 of them sent by the node, one across zones.
            point(
                System::Drove,
                Traffic {
                    client_bytes: 4_000_000,
                    peer_sent_bytes: 8_000_000,
                    cross_zone_sent_bytes: 4_000_000,
                    ..Traffic::default()
                },
            ),
            point(
                System::DroveZoneSync,
                Traffic {
                    client_bytes: 2_000_000,
                    peer_sent_bytes: 4_000_000,
                    cross_zone_sent_bytes: 2_100_000,
                    ..Traffic::default()
                },
            ),
            point(
                System::Baseline,
                Traffic {
                    client_bytes: 1_000_000,
                    proxy_bytes: Some(520_000),
                    computed_wan_bytes: 500_000,
                    ..Traffic::default()
                },
            ),
        ];
        let md = traffic_sections(&cfg, &pts);
        assert_eq!(
            cells(&md, "| op |"),
            [
                "op",
                "X",
                "delay ms",
                "MB written (drove sync)",
                "drove sync node bytes / written",
                "drove sync cross-zone (WAN) / written",
                "MB written (drove zone-sync)",
                "drove zone-sync node bytes / written",
                "drove zone-sync cross-zone (WAN) / written",
                "MB written (baseline)",
                "baseline WAN measured / written",
                "baseline WAN computed / written"
            ]
        );
        assert_eq!(
            cells(&md, "| block-write | 2 | 10 |")[3..],
            ["4.0", "2.00", "1.00", "2.0", "2.00", "1.05", "1.0", "0.52", "0.50"]
        );
        // Only measured (op, X, delay) get a row.
        assert_eq!(md.lines().filter(|l| l.starts_with("| block")).count(), 1);
        assert!(md.contains("MB read (drove zone-sync)"), "{md}");
    }
}
