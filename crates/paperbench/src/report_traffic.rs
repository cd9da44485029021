//! The transfer-efficiency part of results.md: bytes moved in the background per
//! byte the clients wrote (the paper's future work), for drove from the nodes'
//! counters and, for both systems, the bytes that crossed the WAN proxies.
use std::fmt::Write as _;

use crate::config::{Op, PaperConfig, System};
use crate::index::{fmt_ratio, ratio};
use crate::results::PointResult;

fn find(pts: &[PointResult], s: System, op: Op, x: usize, d: u64) -> Option<&PointResult> {
    pts.iter()
        .find(|p| p.system == s && p.op == op && p.x == x && p.delay_ms == d)
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

/// The transfer-efficiency and read-traffic sections.
pub fn traffic_sections(cfg: &PaperConfig, pts: &[PointResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Transfer efficiency (writes)\n");
    let _ = writeln!(
        s,
        "drove: bytes sent between nodes / bytes clients wrote = sum over nodes of \
         `drove_peer_sent_bytes_total` deltas / sum of `drove_nbd_bytes_total{{op=\"write\"}}` \
         deltas; the cross-zone part counts only peers in another zone of the cluster map \
         (what crosses drove's WAN). The baseline has one server and no replication (0 bytes \
         between nodes); its WAN traffic is what its clients outside zone 1 exchange with it: \
         \"measured\" = bytes through its toxiproxy proxies, both directions \
         (`toxiproxy_proxy_received_bytes_total`, NBD headers included), \"computed\" = bytes \
         written by clients outside zone 1 (fio's `io_bytes`, payload only). Sums over the \
         repeats of the point.\n"
    );
    let _ = writeln!(
        s,
        "| op | X | delay ms | MB written (drove) | drove node bytes / written | drove cross-zone (WAN) / written | MB written (baseline) | baseline WAN measured / written | baseline WAN computed / written |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for delay in cfg.delays() {
        for op in Op::ALL.into_iter().filter(|o| o.is_write()) {
            for &x in &cfg.parallel {
                let a = find(pts, System::Drove, op, x, delay);
                let b = find(pts, System::Baseline, op, x, delay);
                let (Some(a), Some(b)) = (a, b) else {
                    continue;
                };
                let _ = writeln!(
                    s,
                    "| {} | {x} | {delay} | {} | {} | {} | {} | {} | {} |",
                    op.name(),
                    mb(a.traffic.client_bytes),
                    fmt_ratio(a.transfer_efficiency()),
                    fmt_ratio(a.cross_zone_efficiency()),
                    mb(b.traffic.client_bytes),
                    fmt_ratio(b.wan_bytes_per_client_byte()),
                    fmt_ratio(ratio(
                        b.traffic.computed_wan_bytes as f64,
                        b.traffic.client_bytes as f64
                    )),
                );
            }
        }
    }
    let _ = writeln!(s, "\n## Reads: bytes between nodes per byte read\n");
    let _ = writeln!(
        s,
        "drove: bytes nodes received from other nodes (`drove_peer_received_bytes_total`, \
         counted by the node that asked) / bytes clients read; reads are not yet zone-local, \
         so this shows how much of a read crosses zones. Baseline as above.\n"
    );
    let _ = writeln!(
        s,
        "| op | X | delay ms | MB read (drove) | drove node bytes / read | drove cross-zone (WAN) / read | baseline WAN measured / read | baseline WAN computed / read |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for delay in cfg.delays() {
        for op in Op::ALL.into_iter().filter(|o| !o.is_write()) {
            for &x in &cfg.parallel {
                let a = find(pts, System::Drove, op, x, delay);
                let b = find(pts, System::Baseline, op, x, delay);
                let (Some(a), Some(b)) = (a, b) else {
                    continue;
                };
                let t = &a.traffic;
                let _ = writeln!(
                    s,
                    "| {} | {x} | {delay} | {} | {} | {} | {} | {} |",
                    op.name(),
                    mb(t.client_bytes),
                    fmt_ratio(ratio(t.peer_received_bytes as f64, t.client_bytes as f64)),
                    fmt_ratio(ratio(
                        t.cross_zone_received_bytes as f64,
                        t.client_bytes as f64
                    )),
                    fmt_ratio(b.wan_bytes_per_client_byte()),
                    fmt_ratio(ratio(
                        b.traffic.computed_wan_bytes as f64,
                        b.traffic.client_bytes as f64
                    )),
                );
            }
        }
    }
    s
}
