//! Live I/O per VDI, cluster-wide (behind `drove vdi iostat`): every node counts
//! the requests of each VDI attached through it (drove_metrics::vdi_io, fed by the
//! export every frontend goes through) and lists them at `GET /api/local/iostat`;
//! any node gathers those lists from the up nodes at `GET /api/iostat`. The
//! counters are cumulative: the client asks twice and shows the difference.
//!
//! Each node also publishes, every [`WINDOW`], the rates of its busiest VDIs as
//! Prometheus gauges ([`TOP`] of them by name, the rest summed), so `/metrics` stays
//! bounded whatever the number of VDIs.
use axum::extract::State;
use axum::Json;
use drove_metrics::{Metrics, VdiIoSample};
use drove_types::clock::unix_ms;
use drove_types::Result;
use futures::future::join_all;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::{Admin, ApiResult};
use crate::api::{ClusterIostat, NodeIostat};
use crate::clients::{ask, up_admins};

/// How long a node is given to list its counters.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// The most VDIs one node's answer may list (an answer is not trusted to be short).
const MAX_VDIS: usize = 100_000;
/// The window of the per-VDI Prometheus rates.
pub const WINDOW: Duration = Duration::from_secs(10);
/// How many VDIs the Prometheus rates name (the rest are summed as `_other`).
pub const TOP: usize = 10;

fn local(a: &Admin) -> NodeIostat {
    NodeIostat {
        node: a.meta.node_id(),
        unix_ms: unix_ms(),
        vdis: a.metrics.vdi_io().samples(),
    }
}

/// `GET /api/local/iostat`: the cumulative I/O of each VDI through this node.
pub(crate) async fn local_iostat(State(a): State<Admin>) -> ApiResult<NodeIostat> {
    Ok(Json(local(&a)))
}

/// `GET /api/iostat`: the same from every up node (this one directly); nodes that
/// do not answer, or answer for another node or with too long a list, are listed
/// as unreachable.
pub(crate) async fn iostat(State(a): State<Admin>) -> ApiResult<ClusterIostat> {
    let me = a.meta.node_id();
    let mut others = up_admins(&a);
    others.retain(|(id, _)| *id != me);
    let a = &a;
    let asks = others.into_iter().map(|(id, addr)| async move {
        let url = a.url(&addr, "/api/local/iostat");
        let res: Result<NodeIostat> = ask(a.http.get(&url).timeout(ASK_TIMEOUT), &url).await;
        (id, res)
    });
    let mut out = ClusterIostat {
        nodes: vec![local(a)],
        unreachable: Vec::new(),
    };
    for (id, res) in join_all(asks).await {
        match res {
            Ok(n) if n.node == id && n.vdis.len() <= MAX_VDIS => out.nodes.push(n),
            Ok(n) => {
                tracing::warn!(
                    node = %id,
                    "its I/O counters were refused: they name node {} and list {} VDIs (at \
                     most {MAX_VDIS})",
                    n.node, n.vdis.len()
                );
                out.unreachable.push(id);
            }
            Err(e) => {
                tracing::warn!(node = %id, "cannot read its I/O counters: {e}");
                out.unreachable.push(id);
            }
        }
    }
    out.nodes.sort_by_key(|n| n.node);
    Ok(Json(out))
}

/// Publish the busiest VDIs' rates every [`WINDOW`], for ever.
pub(crate) async fn publish(metrics: Arc<Metrics>) {
    let mut tick = tokio::time::interval(WINDOW);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = drove_types::clock::Instant::now();
    loop {
        // The first tick is at once: the series exist from the start.
        tick.tick().await;
        let now = drove_types::clock::Instant::now();
        metrics.publish_vdi_window((now - last).as_secs_f64(), TOP);
        last = now;
    }
}

/// The cumulative samples of every VDI summed over the nodes that answered.
pub fn by_vdi(c: &ClusterIostat) -> std::collections::BTreeMap<String, VdiIoSample> {
    let mut out = std::collections::BTreeMap::<String, VdiIoSample>::new();
    for n in &c.nodes {
        for s in &n.vdis {
            out.entry(s.vdi.clone())
                .or_insert_with(|| VdiIoSample {
                    vdi: s.vdi.clone(),
                    ..Default::default()
                })
                .add(s);
        }
    }
    out
}
