//! WAN-mode metrics: where written bytes go, and the zone-sync lag per VDI.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VdiLabels {
    vdi: String,
}

/// The WAN-mode metrics of one node.
pub struct WanMetrics {
    written: Counter,
    cross_zone: Counter,
    shipped: Counter,
    throttled: Counter,
    lag_bytes: Family<VdiLabels, Gauge>,
    lag_writes: Family<VdiLabels, Gauge>,
    lag_seconds: Family<VdiLabels, Gauge<f64, AtomicU64>>,
    /// The VDIs whose lag the last [`WanMetrics::lags`] published.
    published: parking_lot::Mutex<std::collections::BTreeSet<String>>,
}

impl WanMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = WanMetrics {
            written: Counter::default(),
            cross_zone: Counter::default(),
            shipped: Counter::default(),
            throttled: Counter::default(),
            lag_bytes: Family::default(),
            lag_writes: Family::default(),
            lag_seconds: Family::default(),
            published: Default::default(),
        };
        reg.register(
            "gateway_written_bytes",
            "Bytes written through this gateway (each write once, whatever its copies)",
            m.written.clone(),
        );
        reg.register(
            "gateway_cross_zone_bytes",
            "Write payload bytes this gateway sent to nodes of other zones (a relay in a \
             remote zone passes them on inside its zone)",
            m.cross_zone.clone(),
        );
        reg.register(
            "zone_sync_shipped_bytes",
            "Bytes the zone-sync shipper delivered to the copies outside the home zone",
            m.shipped.clone(),
        );
        reg.register(
            "zone_sync_throttled_writes",
            "Writes that waited because their VDI's zone-sync lag was at its bound",
            m.throttled.clone(),
        );
        reg.register(
            "zone_sync_lag_bytes",
            "Bytes acknowledged by the home zone and not yet on the other zones' copies",
            m.lag_bytes.clone(),
        );
        reg.register(
            "zone_sync_lag_writes",
            "Writes acknowledged by the home zone and not yet shipped to the other zones",
            m.lag_writes.clone(),
        );
        reg.register(
            "zone_sync_lag_seconds",
            "Age of the oldest write not yet shipped to the other zones",
            m.lag_seconds.clone(),
        );
        m
    }

    /// `bytes` were written through this gateway.
    pub fn written(&self, bytes: u64) {
        self.written.inc_by(bytes);
    }

    /// The gateway sent `bytes` of write payload to a node of another zone.
    pub fn cross_zone(&self, bytes: u64) {
        self.cross_zone.inc_by(bytes);
    }

    /// The shipper delivered `bytes`.
    pub fn shipped(&self, bytes: u64) {
        self.shipped.inc_by(bytes);
    }

    /// A write waited at its VDI's lag bound.
    pub fn throttled(&self) {
        self.throttled.inc();
    }

    /// The lag of every VDI written through this node now, as (name, bytes,
    /// writes, seconds): the gauges of VDIs not in the list (deleted, renamed, no
    /// longer written here) are removed.
    pub fn lags(&self, lags: &[(String, u64, u64, f64)]) {
        let now: std::collections::BTreeSet<String> = lags.iter().map(|l| l.0.clone()).collect();
        let mut published = self.published.lock();
        for gone in published.difference(&now) {
            self.forget(gone);
        }
        for (name, bytes, writes, seconds) in lags {
            self.lag(name, *bytes, *writes, *seconds);
        }
        *published = now;
    }

    /// VDI `vdi`'s lag now.
    fn lag(&self, vdi: &str, bytes: u64, writes: u64, seconds: f64) {
        let l = VdiLabels {
            vdi: vdi.to_string(),
        };
        self.lag_bytes
            .get_or_create(&l)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.lag_writes
            .get_or_create(&l)
            .set(i64::try_from(writes).unwrap_or(i64::MAX));
        self.lag_seconds.get_or_create(&l).set(seconds);
    }

    /// VDI `vdi` has no lag to report on this node any more.
    fn forget(&self, vdi: &str) {
        let l = VdiLabels {
            vdi: vdi.to_string(),
        };
        self.lag_bytes.remove(&l);
        self.lag_writes.remove(&l);
        self.lag_seconds.remove(&l);
    }
}
