//! The zone-sync lag of a VDI and `drove vdi sync`, over the admin API.
//!
//! The lag lives in the writer's gateway (the node holding the VDI's write lock), so
//! every node answers for the VDIs written through it (`/api/local/vdis/{name}/lag`
//! and `/sync`), and any node finds the holder in the metadata and asks it
//! (`/api/vdis/{name}/lag` and `/sync`). A VDI nobody holds has no lag: whoever wrote
//! it last drained its lane before giving the lock up.
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use drove_types::{Error, NodeId, Result, VdiInfo, WritePolicy};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

use crate::admin::{Admin, ApiResult};
use crate::clients::{ask, encode};

/// How long a holder is given to report its lag.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest `vdi sync` may wait.
const MAX_SYNC_TIMEOUT_S: u64 = 3600;

/// A VDI's zone-sync lag, as its writer's gateway sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LagReport {
    /// The VDI.
    pub vdi: String,
    /// Its write policy.
    pub policy: WritePolicy,
    /// The node writing it (holding its lock), if any.
    pub holder: Option<NodeId>,
    /// Bytes acknowledged and not yet on the copies outside the home zone.
    pub bytes: u64,
    /// Writes not yet shipped.
    pub writes: u64,
    /// Age of the oldest of them, seconds.
    pub seconds: f64,
    /// The VDI's bound in time, milliseconds.
    pub max_lag_ms: u64,
    /// The VDI's bound in bytes.
    pub max_lag_bytes: u64,
}

/// `POST /api/vdis/{name}/sync` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SyncRequest {
    /// Give up after this many seconds (default 300, at most 3600).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// The answer of `vdi sync`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncReport {
    /// The VDI.
    pub vdi: String,
    /// The node that drained its lane (none when nobody writes the VDI).
    pub holder: Option<NodeId>,
    /// How long the sync took, seconds.
    pub seconds: f64,
    /// The lag left when it returned: writes acknowledged after the sync began.
    pub lag_after: LagReport,
}

/// The WAN routes.
pub fn router() -> Router<Admin> {
    Router::new()
        .route("/api/vdis/{name}/lag", get(lag))
        .route("/api/vdis/{name}/sync", post(sync))
        .route("/api/local/vdis/{name}/lag", get(local_lag))
        .route("/api/local/vdis/{name}/sync", post(local_sync))
}

pub(crate) fn report(info: &VdiInfo, holder: Option<NodeId>, lag: drove_replica::Lag) -> LagReport {
    let (time, bytes) = info.max_lag();
    LagReport {
        vdi: info.name.clone(),
        policy: info.policy,
        holder,
        bytes: lag.bytes,
        writes: lag.writes,
        seconds: lag.seconds,
        max_lag_ms: u64::try_from(time.as_millis()).unwrap_or(u64::MAX),
        max_lag_bytes: bytes,
    }
}

/// This node's lag for `info` (zero when no volume of it is open here).
fn here(a: &Admin, info: &VdiInfo) -> LagReport {
    let lag = a
        .exports
        .volume(&info.name)
        .map(|v| v.lag())
        .unwrap_or_default();
    report(info, Some(a.meta.node_id()), lag)
}

/// The holder of `info`'s write lock and its admin address, if a node holds it.
fn holder(a: &Admin, info: &VdiInfo) -> Option<(NodeId, String)> {
    let state = a.meta.state();
    let lock = state.locks.get(&info.id)?;
    let node = state.map.node(lock.owner)?;
    Some((node.id, node.admin_addr.clone()))
}

/// `GET /api/local/vdis/{name}/lag`.
async fn local_lag(State(a): State<Admin>, Path(name): Path<String>) -> ApiResult<LagReport> {
    let info = a.find_vdi(&name)?;
    Ok(Json(here(&a, &info)))
}

/// `GET /api/vdis/{name}/lag`: the lag at the VDI's writer.
async fn lag(State(a): State<Admin>, Path(name): Path<String>) -> ApiResult<LagReport> {
    let info = a.find_vdi(&name)?;
    let Some((node, addr)) = holder(&a, &info) else {
        return Ok(Json(report(&info, None, Default::default())));
    };
    if node == a.meta.node_id() {
        return Ok(Json(here(&a, &info)));
    }
    let url = a.url(
        &addr,
        &format!("/api/local/vdis/{}/lag", encode(&info.name)),
    );
    let r: LagReport = ask(a.http.get(&url).timeout(ASK_TIMEOUT), &url)
        .await
        .map_err(|e| {
            Error::unavailable(format!(
                "The writer of VDI '{name}' (node {node}) did not report its lag: {e}",
                name = drove_types::shown(&name)
            ))
        })?;
    Ok(Json(r))
}

fn timeout_of(req: &SyncRequest) -> Result<Duration> {
    let s = req.timeout_s.unwrap_or(300);
    if s == 0 || s > MAX_SYNC_TIMEOUT_S {
        return Err(Error::invalid(format!(
            "Bad sync timeout {s} s: use 1 to {MAX_SYNC_TIMEOUT_S}"
        )));
    }
    Ok(Duration::from_secs(s))
}

/// `POST /api/local/vdis/{name}/sync`: drain this node's lane of the VDI.
async fn local_sync(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<SyncRequest>,
) -> ApiResult<SyncReport> {
    let info = a.find_vdi(&name)?;
    let limit = timeout_of(&req)?;
    let start = Instant::now();
    let Some(vol) = a.exports.volume(&info.name) else {
        return Ok(Json(SyncReport {
            vdi: info.name.clone(),
            holder: Some(a.meta.node_id()),
            seconds: 0.0,
            lag_after: here(&a, &info),
        }));
    };
    let lag = tokio::time::timeout(limit, vol.sync())
        .await
        .map_err(|_| {
            let now = vol.lag();
            Error::unavailable(format!(
                "VDI '{name}': the copies outside the home zone did not catch up within {} s \
                 ({} bytes in {} writes still to ship, the oldest {:.1} s old)",
                limit.as_secs(),
                now.bytes,
                now.writes,
                now.seconds,
                name = drove_types::shown(&name)
            ))
        })??;
    Ok(Json(SyncReport {
        vdi: info.name.clone(),
        holder: Some(a.meta.node_id()),
        seconds: start.elapsed().as_secs_f64(),
        lag_after: report(&info, Some(a.meta.node_id()), lag),
    }))
}

/// `POST /api/vdis/{name}/sync`: wait until the copies outside the VDI's home zone
/// have every write its writer acknowledged before the call, durably.
async fn sync(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<SyncRequest>,
) -> ApiResult<SyncReport> {
    let info = a.find_vdi(&name)?;
    let limit = timeout_of(&req)?;
    let Some((node, addr)) = holder(&a, &info) else {
        return Ok(Json(SyncReport {
            vdi: info.name.clone(),
            holder: None,
            seconds: 0.0,
            lag_after: report(&info, None, Default::default()),
        }));
    };
    if node == a.meta.node_id() {
        return local_sync(State(a), Path(name), Json(req)).await;
    }
    let url = a.url(
        &addr,
        &format!("/api/local/vdis/{}/sync", encode(&info.name)),
    );
    let call = a
        .http
        .post(&url)
        .json(&req)
        .timeout(limit + Duration::from_secs(5));
    let r: SyncReport = ask(call, &url).await.map_err(|e| {
        Error::unavailable(format!(
            "Syncing VDI '{name}' through its writer, node {node}, failed: {e}",
            name = drove_types::shown(&name)
        ))
    })?;
    Ok(Json(r))
}

/// Set the lag gauges of the VDIs written through this node (before a scrape).
pub(crate) fn publish(a: &Admin) {
    let state = a.meta.state();
    let mut lags = Vec::new();
    for (id, lag) in a.exports.gateway().lags() {
        let name = state.vdis.values().find(|v| v.id == id).map(|v| &v.name);
        match name {
            Some(name) => lags.push((name.clone(), lag.bytes, lag.writes, lag.seconds)),
            None => {
                // Deleted, or moved to a new id by a snapshot: nothing to report.
                a.exports.gateway().forget_idle_lane(id);
            }
        }
    }
    // The gauges of VDIs not listed (deleted, renamed) go.
    a.metrics.wan().lags(&lags);
}
