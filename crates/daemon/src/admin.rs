//! The admin HTTP/JSON API the CLI talks to, and `/metrics`. Every error is a JSON
//! body `{"error": kind, "message": ...}` with a matching HTTP status.
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use drove_meta::{Command, Meta, Reply};
use drove_metrics::Metrics;
use drove_types::{Error, ErrorKind, VdiInfo, WritePolicy, DEFAULT_OBJECT_SIZE};
use std::sync::Arc;

use crate::api;

/// What every handler needs.
#[derive(Clone)]
pub struct Admin {
    pub meta: Arc<Meta>,
    pub metrics: Arc<Metrics>,
    pub nbd_tcp: String,
    /// Whether the NBD TCP port offers or requires TLS (`nbds://` when required).
    pub nbd_tls: drove_nbd::TlsMode,
    pub nbd_socket: String,
    pub recoverer: Arc<drove_replica::Recoverer>,
    /// This node's write locks (a repair holds the VDI's lock while it runs).
    pub locks: Arc<crate::locks::MetaLocks>,
    pub exports: Arc<crate::exports::VdiExports>,
    /// For asking other nodes' admin APIs (who has a VDI open).
    pub http: reqwest::Client,
    /// `https` when the admin APIs speak HTTPS (the nodes have certificates), else
    /// `http`: how [`Admin::url`] reaches another node.
    pub admin_scheme: &'static str,
    /// The directory of the object store (for its disk space).
    pub store_dir: std::path::PathBuf,
    /// The object store's guard: whether its disk failed.
    pub disk: Arc<drove_objstore::GuardedStore>,
    /// The bytes the object store keeps free on that disk (`--reserve-space`).
    pub reserve: u64,
    /// SHA-256 of the node's admin token (`--admin-token-file`); `None`: the admin
    /// API asks for no token (see [`crate::auth`]).
    pub token_sha256: Option<String>,
    /// `/metrics` is served without a token (`--open-metrics`).
    pub open_metrics: bool,
}

impl Admin {
    /// The VDI record named `name`, as this node's metadata has it.
    pub fn find_vdi(&self, name: &str) -> Result<VdiInfo, Error> {
        find_vdi(self, name)
    }

    /// The URL of `path` on the admin API at `addr` (another node's).
    pub fn url(&self, addr: &str, path: &str) -> String {
        format!("{}://{addr}{path}", self.admin_scheme)
    }

    /// The record plus what this node can tell about it.
    pub fn detail(&self, info: VdiInfo) -> api::VdiDetail {
        detail(self, info)
    }
}

/// An [`Error`] as an HTTP response.
pub struct ApiErr(Error);

impl From<Error> for ApiErr {
    fn from(e: Error) -> Self {
        ApiErr(e)
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        let status = match self.0.kind() {
            ErrorKind::NotFound | ErrorKind::Gone => StatusCode::NOT_FOUND,
            ErrorKind::AlreadyExists | ErrorKind::Locked | ErrorKind::Fenced => {
                StatusCode::CONFLICT
            }
            ErrorKind::Invalid => StatusCode::BAD_REQUEST,
            ErrorKind::Unavailable
            | ErrorKind::StaleEpoch
            | ErrorKind::Recovering
            | ErrorKind::OutcomeUnknown => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = api::ApiError {
            error: self.0.kind().as_str().to_string(),
            message: self.0.to_string(),
        };
        (status, Json(body)).into_response()
    }
}

pub(crate) type ApiResult<T> = Result<Json<T>, ApiErr>;

/// The `/api/*` and `/metrics` routes.
pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/api/status", get(status))
        .route("/api/health", get(crate::health::health))
        .route("/api/local/health", get(crate::health::local_health))
        .route("/api/iostat", get(crate::iostat::iostat))
        .route("/api/local/iostat", get(crate::iostat::local_iostat))
        .route("/api/vdis", get(list_vdis).post(create_vdi))
        .route("/api/vdis/{name}", get(vdi_info).delete(delete_vdi))
        .route("/api/vdis/{name}/resize", post(resize_vdi))
        .route("/api/vdis/{name}/rename", post(rename_vdi))
        .route("/api/vdis/{name}/lock/break", post(break_lock))
        .route("/api/vdis/{name}/handover", post(handover))
        .route("/api/vdis/{name}/min-copies", post(min_copies))
        .route("/api/vdis/{name}/policy", post(set_policy))
        .route("/api/vdis/{name}/qos", post(set_qos))
        .route("/api/vdis/{name}/access", post(set_access))
        .route("/api/vdis/{name}/promote", post(promote))
        .route("/api/vdis/{name}/check", post(check_vdi))
        .route("/api/vdis/{name}/clients", get(crate::clients::all_clients))
        .route(
            "/api/local/vdis/{name}/clients",
            get(crate::clients::local_clients),
        )
        .route(
            "/api/local/vdis/{name}/gone",
            get(crate::clients::local_gone),
        )
        .route("/api/recovery", get(recovery))
        .route("/api/nodes/{id}/leave", post(leave_node))
        .route("/api/nodes/{id}/remove", post(remove_node))
        .route("/api/scrub", post(scrub))
        .route("/api/settings", post(settings))
        .route("/metrics", get(metrics))
        .merge(crate::lineage::router())
        .merge(crate::upgrade::router())
        .merge(crate::bench::router())
        .merge(crate::wan::router())
        .merge(crate::auth::router())
        .layer(axum::middleware::from_fn(client_request))
        // axum's own refusals (a body it cannot parse) in the JSON error shape.
        .layer(axum::middleware::from_fn(crate::rejection::json_refusals))
        // Outermost: a request without the right token goes no further.
        .layer(axum::middleware::from_fn_with_state(
            admin.clone(),
            crate::auth::check,
        ))
        .with_state(admin)
}

/// Run the request under its client request id, when it has one; refuse a bad one.
async fn client_request(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use api::REQUEST_ID_HEADER;
    let Some(v) = req.headers().get(REQUEST_ID_HEADER) else {
        return next.run(req).await;
    };
    let id = v
        .to_str()
        .map_err(|_| "it is not ASCII".to_string())
        .and_then(drove_meta::ClientRequestId::parse);
    match id {
        Ok(id) => drove_meta::with_client_request(id, next.run(req)).await,
        Err(e) => ApiErr(Error::invalid(format!(
            "Bad {REQUEST_ID_HEADER} header: {e}"
        )))
        .into_response(),
    }
}

async fn metrics(State(a): State<Admin>) -> impl IntoResponse {
    crate::wan::publish(&a);
    a.meta.publish_metrics();
    let objects = a
        .recoverer
        .object_count(std::time::Duration::from_secs(60))
        .await
        .ok();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::ops_metrics::encode(&a, a.metrics.encode(), objects),
    )
}

async fn status(State(a): State<Admin>) -> ApiResult<api::Status> {
    let st = a.meta.status();
    let state = a.meta.state();
    Ok(Json(api::Status {
        cluster_id: a.meta.cluster_id(),
        node_id: a.meta.node_id(),
        leader: st.leader,
        term: st.term,
        voters: st.voters,
        learners: st.learners,
        map: state.map.clone(),
        epoch_history: state.epoch_changes(),
        maps_from: state.epoch_history.first().map(|r| r.epoch),
        default_copies: state.settings.default_copies,
        vdi_count: state.vdis.len(),
        quorum_age_ms: st.quorum_age_ms,
        noout: state.settings.noout,
        feature_level: state.settings.feature_level,
    }))
}

/// How long a consistent read may take to confirm the node's view.
const READ_BARRIER: std::time::Duration = std::time::Duration::from_secs(3);

/// For a consistent read: wait until this node has applied every committed change.
async fn barrier(a: &Admin, q: &api::ReadQuery) -> Result<(), Error> {
    if q.consistent {
        a.meta.read_barrier(READ_BARRIER).await?;
    }
    Ok(())
}

async fn list_vdis(
    State(a): State<Admin>,
    axum::extract::Query(q): axum::extract::Query<api::ReadQuery>,
) -> ApiResult<Vec<VdiInfo>> {
    barrier(&a, &q).await?;
    Ok(Json(a.meta.state().vdis.values().cloned().collect()))
}

/// The NBD URI of VDI `name` on TCP address `addr`: `nbds://` where the port
/// requires TLS (a plaintext client is refused there), `nbd://` elsewhere.
fn nbd_uri(tls: drove_nbd::TlsMode, addr: &str, name: &str) -> String {
    let scheme = if tls == drove_nbd::TlsMode::Require {
        "nbds"
    } else {
        "nbd"
    };
    format!("{scheme}://{addr}/{name}")
}

fn detail(a: &Admin, info: VdiInfo) -> api::VdiDetail {
    let state = a.meta.state();
    api::VdiDetail {
        lock: state.locks.get(&info.id).cloned(),
        lock_generation: state.lock_generations.get(&info.id).copied().unwrap_or(0),
        settled_generation: state.settled.get(&info.id).copied().unwrap_or(0),
        objects: info.object_count(),
        // A witness serves no NBD: no URIs.
        nbd_tcp: if a.nbd_tcp.is_empty() {
            String::new()
        } else {
            nbd_uri(a.nbd_tls, &a.nbd_tcp, &info.name)
        },
        nbd_unix: if a.nbd_socket.is_empty() {
            String::new()
        } else {
            format!("nbd+unix:///{}?socket={}", info.name, a.nbd_socket)
        },
        info,
    }
}

async fn vdi_info(
    State(a): State<Admin>,
    Path(name): Path<String>,
    axum::extract::Query(q): axum::extract::Query<api::ReadQuery>,
) -> ApiResult<api::VdiDetail> {
    barrier(&a, &q).await?;
    let info = find_vdi(&a, &name)?;
    Ok(Json(detail(&a, info)))
}

/// The VDI record named `name`, as this node's metadata has it.
fn find_vdi(a: &Admin, name: &str) -> Result<VdiInfo, Error> {
    a.meta
        .state()
        .vdis
        .get(name)
        // A deleted snapshot kept for its readers has no name a user may use.
        .filter(|_| !drove_types::is_kept(name))
        .cloned()
        .ok_or_else(|| {
            Error::not_found(format!(
                "No VDI named '{name}'",
                name = drove_types::shown(name)
            ))
        })
}

/// The VDI record a metadata command answered with.
pub(crate) fn expect_vdi(reply: Reply) -> Result<VdiInfo, Error> {
    match reply {
        Reply::Vdi(v) => Ok(v),
        other => Err(Error::new(
            ErrorKind::Io,
            format!("Unexpected metadata reply {other:?}"),
        )),
    }
}

async fn create_vdi(
    State(a): State<Admin>,
    Json(req): Json<api::CreateVdi>,
) -> ApiResult<api::VdiDetail> {
    let now = drove_types::clock::unix_secs();
    let policy = parse_policy(req.write.policy.as_deref())?.unwrap_or_default();
    let reply = a
        .meta
        .execute(Command::CreateVdi {
            name: req.name,
            size: req.size,
            copies: req.copies,
            mode: req.mode,
            object_size: DEFAULT_OBJECT_SIZE,
            now,
            home_zone: req.home_zone,
            home_copies: req.home_copies,
            policy,
            max_lag_ms: req.write.max_lag_ms,
            max_lag_bytes: req.write.max_lag_bytes,
            qos: req.qos,
        })
        .await?;
    let mut info = expect_vdi(reply)?;
    if req.min_copies.is_some() {
        let set = Command::SetMinCopies {
            name: info.name.clone(),
            min_copies: req.min_copies,
        };
        match a.meta.execute(set).await {
            Ok(reply) => info = expect_vdi(reply)?,
            Err(e) => {
                // Leave nothing half made.
                let _ = a
                    .meta
                    .execute(Command::DeleteVdi {
                        name: info.name.clone(),
                        force: false,
                    })
                    .await;
                return Err(e.into());
            }
        }
    }
    Ok(Json(detail(&a, info)))
}

async fn min_copies(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::MinCopies>,
) -> ApiResult<api::VdiDetail> {
    let reply = a
        .meta
        .execute(Command::SetMinCopies {
            name,
            min_copies: req.min_copies,
        })
        .await?;
    Ok(Json(detail(&a, expect_vdi(reply)?)))
}

/// A write policy named in a request, refused as `Invalid` (400) when unknown.
fn parse_policy(s: Option<&str>) -> Result<Option<WritePolicy>, Error> {
    s.map(str::parse).transpose()
}

async fn set_policy(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Policy>,
) -> ApiResult<api::VdiDetail> {
    let reply = a
        .meta
        .execute(Command::SetVdiPolicy {
            name,
            policy: parse_policy(req.policy.as_deref())?,
            max_lag_ms: req.max_lag_ms,
            max_lag_bytes: req.max_lag_bytes,
            reset_max_lag_ms: req.reset_max_lag_ms,
            reset_max_lag_bytes: req.reset_max_lag_bytes,
        })
        .await?;
    Ok(Json(detail(&a, expect_vdi(reply)?)))
}

/// `POST /api/vdis/{name}/qos`: a change of the VDI's I/O limits (a limit of 0
/// lifts it); attached clients are held to the new limits within a second.
async fn set_qos(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(change): Json<drove_types::Qos>,
) -> ApiResult<api::VdiDetail> {
    // Checked here too, so that a bad limit never becomes a Raft entry.
    change.validate(true)?;
    let reply = a
        .meta
        .execute(Command::SetVdiQos { name, qos: change })
        .await?;
    Ok(Json(detail(&a, expect_vdi(reply)?)))
}

async fn set_access(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Access>,
) -> ApiResult<api::VdiDetail> {
    // Checked here too, so that a bad list never becomes a Raft entry.
    drove_types::validate_client_names(&req.nbd_clients)?;
    let reply = a
        .meta
        .execute(Command::SetVdiAccess {
            name,
            nbd_clients: req.nbd_clients,
        })
        .await?;
    Ok(Json(detail(&a, expect_vdi(reply)?)))
}

async fn promote(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Promote>,
) -> ApiResult<api::VdiDetail> {
    let reply = a
        .meta
        .execute(Command::PromoteVdi {
            name,
            zone: req.zone,
        })
        .await?;
    Ok(Json(detail(&a, expect_vdi(reply)?)))
}

async fn check_vdi(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Check>,
) -> ApiResult<drove_replica::CheckReport> {
    let info = find_vdi(&a, &name)?;
    if req.repair {
        return Ok(Json(a.locks.check_and_repair(&a.recoverer, &info).await?));
    }
    Ok(Json(a.recoverer.check(&info, false).await?))
}

async fn recovery(State(a): State<Admin>) -> ApiResult<api::Recovery> {
    let store = a.recoverer.store().clone();
    let local_objects = drove_replica::local::blocking(&store, |s| s.list())
        .await?
        .len() as u64;
    Ok(Json(api::Recovery {
        node_id: a.meta.node_id(),
        progress: a.recoverer.progress(),
        local_objects,
    }))
}

/// Drain a node: weight 0 takes it out of placement (one epoch), so the others copy
/// its objects from it, and it drops its copies once their new holders confirm.
async fn leave_node(
    State(a): State<Admin>,
    Path(id): Path<u64>,
) -> ApiResult<drove_types::NodeInfo> {
    let state = a.meta.state();
    let mut node = state
        .map
        .node(drove_types::NodeId(id))
        .cloned()
        .ok_or_else(|| Error::not_found(format!("No node {id} in the cluster")))?;
    let others = state
        .map
        .up_nodes()
        .filter(|n| n.id != node.id && n.weight > 0)
        .count();
    let need = state.vdis.values().map(|v| v.copies).max().unwrap_or(1);
    if others < usize::from(need) {
        return Err(Error::invalid(format!(
            "Node {id} cannot leave: VDIs need {need} copies and only {others} other nodes would hold data"
        ))
        .into());
    }
    node.weight = 0;
    a.meta.execute(Command::UpsertNode(node.clone())).await?;
    Ok(Json(node))
}

/// Forget a drained (weight 0) or down node: out of the cluster map, then out of the
/// metadata membership. Repeating it after a partial failure finishes the job.
async fn remove_node(State(a): State<Admin>, Path(id): Path<u64>) -> ApiResult<serde_json::Value> {
    let node = drove_types::NodeId(id);
    let in_map = a.meta.state().map.node(node).is_some();
    let status = a.meta.status();
    let member = status.voters.contains(&node) || status.learners.contains(&node);
    if !in_map && !member {
        return Err(Error::not_found(format!("No node {id} in the cluster")).into());
    }
    if in_map {
        a.meta.execute(Command::RemoveNode { id: node }).await?;
    }
    a.meta.remove_member(id).await?;
    Ok(Json(serde_json::json!({ "removed": id })))
}

async fn scrub(State(a): State<Admin>) -> ApiResult<drove_replica::ScrubReport> {
    Ok(Json(a.recoverer.scrub().await?))
}

async fn delete_vdi(
    State(a): State<Admin>,
    Path(name): Path<String>,
    axum::extract::Query(q): axum::extract::Query<api::DeleteQuery>,
) -> ApiResult<serde_json::Value> {
    let id = match find_vdi(&a, &name) {
        Ok(v) => Some(v.id),
        // A client's retry of a delete whose answer it lost: the metadata answers
        // with the first outcome (or "no such VDI" if it never happened).
        Err(_) if drove_meta::in_client_request() => None,
        Err(e) => return Err(e.into()),
    };
    if !q.force && id.is_some() {
        crate::clients::refuse_if_open(&a, &name).await?;
    }
    // A client that just detached may still be releasing the lock: give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match a
            .meta
            .execute(Command::DeleteVdi {
                name: name.clone(),
                force: q.force,
            })
            .await
        {
            Ok(reply) => {
                // A snapshot others read from: its name went, its blocks stay.
                let kept_for = match reply {
                    drove_meta::Reply::Kept(readers) => readers,
                    _ => Vec::new(),
                };
                let lagging = match id {
                    Some(id) => crate::clients::await_dropped(&a, &name, id).await,
                    None => Vec::new(),
                };
                if !lagging.is_empty() {
                    tracing::warn!(
                        "VDI '{name}' deleted, but nodes {lagging:?} had not applied it within 5 s"
                    );
                }
                return Ok(Json(
                    serde_json::json!({ "deleted": name, "not_yet_applied": lagging, "kept_for": kept_for }),
                ));
            }
            Err(e) if e.kind() == ErrorKind::Locked && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn handover(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Handover>,
) -> ApiResult<api::VdiDetail> {
    a.meta
        .execute(Command::RequestHandover {
            vdi: name.clone(),
            to: req.to,
        })
        .await?;
    let info = find_vdi(&a, &name)?;
    Ok(Json(detail(&a, info)))
}

async fn resize_vdi(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Resize>,
) -> ApiResult<api::VdiDetail> {
    let cmd = if req.grow {
        Command::GrowVdi { name, by: req.size }
    } else {
        Command::ResizeVdi {
            name,
            size: req.size,
        }
    };
    let reply = a.meta.execute(cmd).await?;
    Ok(Json(detail(&a, expect_vdi(reply)?)))
}

/// Rename a VDI nobody has open: NBD clients name their export, so an open one
/// would lose it (the state machine itself refuses a VDI with a live writer).
async fn rename_vdi(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Rename>,
) -> ApiResult<api::VdiDetail> {
    drove_types::validate_name(&req.to)?;
    match find_vdi(&a, &name) {
        Ok(_) => crate::clients::refuse_if_open(&a, &name).await?,
        // A client's retry of a rename whose answer it lost: the metadata answers
        // with the first outcome.
        Err(_) if drove_meta::in_client_request() => {}
        Err(e) => return Err(e.into()),
    }
    let reply = a
        .meta
        .execute(Command::RenameVdi { name, to: req.to })
        .await?;
    Ok(Json(detail(&a, expect_vdi(reply)?)))
}

/// `POST /api/vdis/{name}/lock/break` (see `drove_meta`'s `Command::BreakLock`).
async fn break_lock(State(a): State<Admin>, Path(name): Path<String>) -> ApiResult<api::LockBreak> {
    let reply = a
        .meta
        .execute(Command::BreakLock { vdi: name.clone() })
        .await?;
    let broken = match reply {
        Reply::Lock(l) => {
            tracing::warn!(vdi = %name, owner = %l.owner, generation = l.generation,
                "write lock broken by an operator: its holder is fenced");
            Some(l)
        }
        _ => None,
    };
    let id = find_vdi(&a, &name)?.id;
    let fenced_below = a
        .meta
        .state()
        .lock_generations
        .get(&id)
        .copied()
        .unwrap_or(0);
    Ok(Json(api::LockBreak {
        broken,
        fenced_below,
    }))
}

async fn settings(
    State(a): State<Admin>,
    Json(req): Json<api::Settings>,
) -> ApiResult<api::Settings> {
    if let Some(c) = req.default_copies {
        a.meta.execute(Command::SetDefaultCopies(c)).await?;
    }
    if req.down_after_ms.is_some() || req.recovery_mib_s.is_some() || req.hold_down_ms.is_some() {
        a.meta
            .execute(Command::SetHealthSettings {
                down_after_ms: req.down_after_ms,
                recovery_mib_s: req.recovery_mib_s,
                hold_down_ms: req.hold_down_ms,
            })
            .await?;
    }
    if let Some(on) = req.noout {
        if a.meta.state().settings.noout != on {
            a.meta.execute(Command::SetNoout(on)).await?;
            tracing::warn!(
                "noout {} by an operator",
                if on {
                    "set: down nodes are not re-replicated"
                } else {
                    "cleared: down nodes are re-replicated again"
                }
            );
        }
    }
    if let Some(pct) = req.backfill_full_pct {
        if a.meta.state().settings.backfill_full_pct != pct {
            a.meta.execute(Command::SetBackfillFull(pct)).await?;
            tracing::warn!(
                "backfill-full set to {pct} % by an operator: recovery stops copying onto disks this full"
            );
        }
    }
    if let Some(change) = req.default_qos.filter(|q| !q.is_empty_change()) {
        change.validate(true)?;
        a.meta.execute(Command::SetDefaultQos(change)).await?;
    }
    let s = a.meta.state().settings.clone();
    Ok(Json(api::Settings {
        default_copies: Some(s.default_copies),
        down_after_ms: Some(s.down_after_ms),
        recovery_mib_s: Some(s.recovery_mib_s),
        hold_down_ms: Some(s.hold_down_ms),
        noout: Some(s.noout),
        backfill_full_pct: Some(s.backfill_full_pct),
        default_qos: Some(s.default_qos),
        feature_level: Some(s.feature_level),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_tcp_uri_says_nbds_where_tls_is_required() {
        use drove_nbd::TlsMode;
        assert_eq!(
            nbd_uri(TlsMode::Require, "10.0.0.1:10809", "vm"),
            "nbds://10.0.0.1:10809/vm"
        );
        // Allow takes plaintext clients too; Off refuses STARTTLS.
        for mode in [TlsMode::Allow, TlsMode::Off] {
            assert_eq!(nbd_uri(mode, "h:1", "vm"), "nbd://h:1/vm");
        }
    }
}
