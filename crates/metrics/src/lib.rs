//! The node's metrics, served in Prometheus text format at `/metrics` on the admin
//! port. Frontends and the replication layer report into one [`Metrics`] value that
//! the node passes to them explicitly (no global registry).
#![deny(missing_docs)]

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

mod meta;
pub mod vdi_io;
mod wan;
pub use meta::MetaMetrics;
pub use vdi_io::{VdiIo, VdiIoSample, VdiIoTable};
pub use wan::WanMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpResultLabels {
    op: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    peer: String,
}

fn latency_histogram() -> Histogram {
    // 10 µs .. ~10 s in 21 doubling steps.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 21))
}

/// One family triple (count by result, bytes, latency) for one kind of operation.
struct OpFamilies {
    ops: Family<OpResultLabels, Counter>,
    bytes: Family<OpLabels, Counter>,
    latency: Family<OpLabels, Histogram, fn() -> Histogram>,
}

impl OpFamilies {
    fn register(reg: &mut Registry, prefix: &str, what: &str) -> Self {
        let f = OpFamilies {
            ops: Family::default(),
            bytes: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        };
        reg.register(
            format!("{prefix}_ops"),
            format!("{what} requests by operation and result"),
            f.ops.clone(),
        );
        reg.register(
            format!("{prefix}_bytes"),
            format!("{what} payload bytes by operation"),
            f.bytes.clone(),
        );
        reg.register(
            format!("{prefix}_latency_seconds"),
            format!("{what} request latency by operation"),
            f.latency.clone(),
        );
        f
    }

    fn record(&self, op: &str, bytes: u64, secs: f64, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.ops
            .get_or_create(&OpResultLabels {
                op: op.to_string(),
                result: result.to_string(),
            })
            .inc();
        let l = OpLabels { op: op.to_string() };
        if bytes > 0 {
            self.bytes.get_or_create(&l).inc_by(bytes);
        }
        self.latency.get_or_create(&l).observe(secs);
    }
}

/// All metrics of one node.
pub struct Metrics {
    registry: Registry,
    nbd: OpFamilies,
    peer_client: OpFamilies,
    peer_server: OpFamilies,
    peer_sent: Family<PeerLabels, Counter>,
    peer_received: Family<PeerLabels, Counter>,
    peer_silent: Family<PeerLabels, Counter>,
    peer_rtt: Family<PeerLabels, Gauge<f64, AtomicU64>>,
    peer_wire: Family<PeerLabels, Gauge>,
    markdowns: Family<MarkdownLabels, Counter>,
    spared: Family<PeerLabels, Counter>,
    reads: Family<WhereLabels, Counter>,
    hedged_reads: Counter,
    hedge_wins: Counter,
    nbd_open: Gauge,
    nbd_refused: Family<ReasonLabels, Counter>,
    qos_throttled: Family<OpLabels, Counter<f64, AtomicU64>>,
    wan: WanMetrics,
    meta: MetaMetrics,
    vdi_io: VdiIoTable,
    vdi_iops: Family<VdiOpLabels, Gauge<f64, AtomicU64>>,
    vdi_bps: Family<VdiOpLabels, Gauge<f64, AtomicU64>>,
}

/// A VDI (or `_other`, the sum of the rest) and an operation (read, write).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VdiOpLabels {
    vdi: String,
    op: String,
}

/// Why a connection was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// Where the replica that served a read sits, seen from the gateway.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhereLabels {
    r#where: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MarkdownLabels {
    node: String,
    cause: String,
}

impl Metrics {
    /// A fresh set of metrics.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("drove");
        let nbd = OpFamilies::register(&mut registry, "nbd", "NBD");
        let peer_client = OpFamilies::register(
            &mut registry,
            "peer_client",
            "Peer requests sent by this node",
        );
        let peer_server = OpFamilies::register(
            &mut registry,
            "peer_server",
            "Peer requests served by this node",
        );
        let peer_sent = Family::<PeerLabels, Counter>::default();
        let peer_received = Family::<PeerLabels, Counter>::default();
        registry.register(
            "peer_sent_bytes",
            "Bytes sent to each peer node (frames on the wire)",
            peer_sent.clone(),
        );
        registry.register(
            "peer_received_bytes",
            "Bytes received from each peer node (frames on the wire)",
            peer_received.clone(),
        );
        let peer_silent = Family::<PeerLabels, Counter>::default();
        registry.register(
            "peer_silences",
            "Connections given up because the peer said nothing while requests waited",
            peer_silent.clone(),
        );
        let peer_rtt = Family::<PeerLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "peer_rtt_seconds",
            "Smoothed round trip to each peer, measured by pings",
            peer_rtt.clone(),
        );
        let peer_wire = Family::<PeerLabels, Gauge>::default();
        registry.register(
            "peer_wire_version",
            "The drove wire version of this node's last connection to each peer, the highest both speak",
            peer_wire.clone(),
        );
        let markdowns = Family::<MarkdownLabels, Counter>::default();
        registry.register(
            "gateway_markdowns",
            "Replicas this gateway had marked down, by node and cause (silent, error)",
            markdowns.clone(),
        );
        let spared = Family::<PeerLabels, Counter>::default();
        registry.register(
            "gateway_spared",
            "Replicas that failed a request by going silent but answered this gateway's ping: \
             the request went again and they were not marked down",
            spared.clone(),
        );
        let reads = Family::<WhereLabels, Counter>::default();
        registry.register(
            "gateway_reads",
            "Reads this gateway served, by where the answering replica is (local, zone, remote; before-move: a copy placed before the home zone moved)",
            reads.clone(),
        );
        let hedged_reads = Counter::default();
        registry.register(
            "gateway_hedged_reads",
            "Reads also sent to the next replica because the first was slow to answer",
            hedged_reads.clone(),
        );
        let hedge_wins = Counter::default();
        registry.register(
            "gateway_hedge_wins",
            "Hedged reads served by the hedge rather than by the first replica",
            hedge_wins.clone(),
        );
        let nbd_open = Gauge::default();
        registry.register(
            "nbd_connections",
            "NBD connections open now (TCP and the unix socket)",
            nbd_open.clone(),
        );
        let qos_throttled = Family::<OpLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "qos_throttled_seconds",
            "Time clients' requests waited for their VDI's I/O limits (drove vdi set --iops-limit ...), in seconds, by op (read, write)",
            qos_throttled.clone(),
        );
        let nbd_refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "nbd_connections_refused",
            "NBD connections closed at accept because a limit was reached (per_client: \
             that address has its most open; total: the node has its most open)",
            nbd_refused.clone(),
        );
        let wan = WanMetrics::register(&mut registry);
        let meta = MetaMetrics::register(&mut registry);
        let vdi_iops = Family::<VdiOpLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "vdi_iops",
            "Requests per second of the busiest VDIs through this gateway over the last \
             window, by operation (the rest summed as vdi=\"_other\")",
            vdi_iops.clone(),
        );
        let vdi_bps = Family::<VdiOpLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "vdi_bytes_per_second",
            "Bytes per second of the busiest VDIs through this gateway over the last \
             window, by operation (the rest summed as vdi=\"_other\")",
            vdi_bps.clone(),
        );
        Arc::new(Metrics {
            registry,
            nbd,
            peer_client,
            peer_server,
            peer_sent,
            peer_received,
            peer_silent,
            peer_rtt,
            peer_wire,
            markdowns,
            spared,
            reads,
            hedged_reads,
            hedge_wins,
            nbd_open,
            nbd_refused,
            qos_throttled,
            wan,
            meta,
            vdi_io: VdiIoTable::default(),
            vdi_iops,
            vdi_bps,
        })
    }

    /// The I/O counters of every VDI through this gateway.
    pub fn vdi_io(&self) -> &VdiIoTable {
        &self.vdi_io
    }

    /// Close a window of `secs` seconds of per-VDI I/O and publish its rates: the
    /// `top` busiest VDIs by requests each under their name, the others summed as
    /// `_other` (so the series stay bounded whatever the number of VDIs; `_other` is
    /// shown, at 0, when there are no others).
    pub fn publish_vdi_window(&self, secs: f64, top: usize) {
        let window = self.vdi_io.window();
        self.vdi_iops.clear();
        self.vdi_bps.clear();
        let secs = secs.max(1e-3);
        let mut other = VdiIoSample {
            vdi: "_other".to_string(),
            ..Default::default()
        };
        let mut shown: Vec<&VdiIoSample> = Vec::new();
        for (i, s) in window.iter().enumerate() {
            if i < top {
                shown.push(s);
            } else {
                other.add(s);
            }
        }
        // Always there (0 when every VDI is named), so the series exist from the
        // first window on.
        shown.push(&other);
        for s in shown {
            for (op, o) in [("read", &s.read), ("write", &s.write)] {
                let l = VdiOpLabels {
                    vdi: s.vdi.clone(),
                    op: op.to_string(),
                };
                self.vdi_iops.get_or_create(&l).set(o.ops as f64 / secs);
                self.vdi_bps.get_or_create(&l).set(o.bytes as f64 / secs);
            }
        }
    }

    /// Record one NBD request: `op` is `read`, `write`, `flush`, `trim`, ...
    pub fn nbd_op(&self, op: &str, bytes: u64, secs: f64, ok: bool) {
        self.nbd.record(op, bytes, secs, ok);
    }

    /// Record one peer request this node sent and its round trip.
    pub fn peer_client_op(&self, op: &str, bytes: u64, secs: f64, ok: bool) {
        self.peer_client.record(op, bytes, secs, ok);
    }

    /// Record one peer request this node served.
    pub fn peer_server_op(&self, op: &str, bytes: u64, secs: f64, ok: bool) {
        self.peer_server.record(op, bytes, secs, ok);
    }

    /// Count bytes written to the connection to `peer` (a node id or address).
    pub fn peer_sent(&self, peer: &str, bytes: u64) {
        self.peer_sent
            .get_or_create(&PeerLabels {
                peer: peer.to_string(),
            })
            .inc_by(bytes);
    }

    /// Count bytes read from the connection to `peer`.
    pub fn peer_received(&self, peer: &str, bytes: u64) {
        self.peer_received
            .get_or_create(&PeerLabels {
                peer: peer.to_string(),
            })
            .inc_by(bytes);
    }

    /// Count a connection given up because `peer` went silent.
    pub fn peer_silent(&self, peer: &str) {
        self.peer_silent
            .get_or_create(&PeerLabels {
                peer: peer.to_string(),
            })
            .inc();
    }

    /// The wire version a new connection to `peer` chose.
    pub fn peer_wire_version(&self, peer: &str, version: u8) {
        self.peer_wire
            .get_or_create(&PeerLabels {
                peer: peer.to_string(),
            })
            .set(i64::from(version));
    }

    /// Set the smoothed round trip to `peer`.
    pub fn peer_rtt(&self, peer: &str, secs: f64) {
        self.peer_rtt
            .get_or_create(&PeerLabels {
                peer: peer.to_string(),
            })
            .set(secs);
    }

    /// Count a replica on `node` that this gateway had marked down, for `cause`.
    pub fn gateway_markdown(&self, node: &str, cause: &str) {
        self.markdowns
            .get_or_create(&MarkdownLabels {
                node: node.to_string(),
                cause: cause.to_string(),
            })
            .inc();
    }

    /// Count a replica on `peer` that went silent, answered a ping and was spared
    /// a mark-down.
    pub fn gateway_spared(&self, peer: &str) {
        self.spared
            .get_or_create(&PeerLabels {
                peer: peer.to_string(),
            })
            .inc();
    }

    /// Count a read this gateway served from a replica at `place`: `local` (its own
    /// store), `zone` (a node of its zone), `remote`, or `before-move` (a copy placed
    /// before the VDI's home zone moved, while the new holders catch up).
    pub fn gateway_read(&self, place: &str) {
        self.reads
            .get_or_create(&WhereLabels {
                r#where: place.to_string(),
            })
            .inc();
    }

    /// Count a read sent to a second replica while the first had not answered.
    pub fn gateway_hedged_read(&self) {
        self.hedged_reads.inc();
    }

    /// Count a hedged read whose answer came from the hedge.
    pub fn gateway_hedge_win(&self) {
        self.hedge_wins.inc();
    }

    /// A client's request going `op` (`read`, `write`) waited `secs` for its VDI's
    /// I/O limits.
    pub fn qos_throttled(&self, op: &str, secs: f64) {
        self.qos_throttled
            .get_or_create(&OpLabels { op: op.to_string() })
            .inc_by(secs);
    }

    /// An NBD connection was accepted.
    pub fn nbd_connection_opened(&self) {
        self.nbd_open.inc();
    }

    /// An accepted NBD connection ended.
    pub fn nbd_connection_closed(&self) {
        self.nbd_open.dec();
    }

    /// An NBD connection was refused at accept, for `reason` (`per_client`, `total`).
    pub fn nbd_connection_refused(&self, reason: &str) {
        self.nbd_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The WAN-mode metrics.
    pub fn wan(&self) -> &WanMetrics {
        &self.wan
    }

    /// The metadata (Raft) metrics.
    pub fn meta(&self) -> &MetaMetrics {
        &self.meta
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_encode_contains_recorded_ops() {
        let m = Metrics::new();
        m.nbd_op("read", 4096, 0.001, true);
        m.peer_sent("2", 100);
        let text = m.encode();
        assert!(
            text.contains("drove_nbd_ops_total{op=\"read\",result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("drove_nbd_bytes_total{op=\"read\"} 4096"),
            "{text}"
        );
        assert!(
            text.contains("drove_peer_sent_bytes_total{peer=\"2\"} 100"),
            "{text}"
        );
        assert!(text.contains("drove_nbd_latency_seconds_bucket"), "{text}");
    }

    #[test]
    fn test_the_lag_gauges_of_a_vdi_no_longer_listed_are_removed() {
        let m = Metrics::new();
        m.wan().lags(&[
            ("a".to_string(), 4096, 1, 0.5),
            ("b".to_string(), 8192, 2, 1.5),
        ]);
        let text = m.encode();
        assert!(
            text.contains("drove_zone_sync_lag_bytes{vdi=\"a\"} 4096"),
            "{text}"
        );
        assert!(
            text.contains("drove_zone_sync_lag_writes{vdi=\"b\"} 2"),
            "{text}"
        );
        // b was deleted (or renamed): its gauges go, a's are updated.
        m.wan().lags(&[("a".to_string(), 0, 0, 0.0)]);
        let text = m.encode();
        assert!(
            text.contains("drove_zone_sync_lag_bytes{vdi=\"a\"} 0"),
            "{text}"
        );
        assert!(!text.contains("vdi=\"b\""), "{text}");
        m.wan().lags(&[]);
        assert!(!m.encode().contains("vdi=\"a\""));
    }

    #[test]
    fn test_per_vdi_rates_show_the_busiest_and_sum_the_rest() {
        let m = Metrics::new();
        for (name, n) in [("a", 30), ("b", 20), ("c", 10), ("d", 5)] {
            let io = m.vdi_io().vdi(name);
            for _ in 0..n {
                io.write(4096, 1e-4, true);
            }
        }
        m.publish_vdi_window(10.0, 2);
        let text = m.encode();
        for line in [
            "drove_vdi_iops{vdi=\"a\",op=\"write\"} 3.0",
            "drove_vdi_iops{vdi=\"b\",op=\"write\"} 2.0",
            "drove_vdi_iops{vdi=\"_other\",op=\"write\"} 1.5",
            "drove_vdi_bytes_per_second{vdi=\"a\",op=\"write\"} 12288.0",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        assert!(!text.contains("vdi=\"c\""), "{text}");
        // With no VDI at all, `_other` says 0: the series exist from the start.
        let fresh = Metrics::new();
        fresh.publish_vdi_window(10.0, 2);
        assert!(
            fresh
                .encode()
                .contains("drove_vdi_iops{vdi=\"_other\",op=\"read\"} 0.0"),
            "{}",
            fresh.encode()
        );
        // The next window had nothing: every series says 0, none is left over.
        m.publish_vdi_window(10.0, 2);
        let text = m.encode();
        assert!(
            text.contains("drove_vdi_iops{vdi=\"a\",op=\"write\"} 0.0"),
            "{text}"
        );
    }

    #[test]
    fn test_gateway_reads_are_counted_by_place_and_hedges_apart() {
        let m = Metrics::new();
        m.gateway_read("local");
        m.gateway_read("remote");
        m.gateway_read("remote");
        m.gateway_hedged_read();
        m.gateway_hedge_win();
        let text = m.encode();
        for line in [
            "drove_gateway_reads_total{where=\"local\"} 1",
            "drove_gateway_reads_total{where=\"remote\"} 2",
            "drove_gateway_hedged_reads_total 1",
            "drove_gateway_hedge_wins_total 1",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
    }
}
