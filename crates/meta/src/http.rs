//! The server side of the metadata's HTTP routes, mounted on the node's admin
//! listener: Raft RPCs under `/raft/` (answered by the local Raft whatever its role)
//! and internal calls under `/meta/` (answered only by the leader; see
//! [`crate::remote`]). Bodies are JSON.
use crate::meta::Meta;
use crate::remote::{Hello, JoinRequest, Role, Wire, Written, CLUSTER_HEADER};
use crate::types::{Request, TypeConfig};
use crate::write::SERVE_TIMEOUT;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use std::sync::Arc;

/// Largest request body: a batch of log entries or a snapshot chunk, JSON encoded.
const BODY_LIMIT: usize = 64 << 20;

pub(crate) fn router(meta: Arc<Meta>) -> Router {
    let internal = Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/snapshot", post(snapshot))
        .route("/meta/write", post(write))
        .route("/meta/join", post(join))
        .route("/meta/remove", post(remove))
        .route("/meta/heartbeat", post(crate::health::receive))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .route_layer(middleware::from_fn_with_state(meta.clone(), same_cluster));
    Router::new()
        .route("/meta/hello", get(hello))
        .merge(internal)
        .with_state(meta)
}

async fn hello(State(meta): State<Arc<Meta>>) -> Json<Hello> {
    Json(Hello {
        cluster: meta.cluster,
        node: meta.id,
    })
}

/// Refuse an internal call that does not name this node's cluster: a node left
/// running from another cluster (whose ports were reused) must not vote, append,
/// write metadata or send heartbeats here.
async fn same_cluster(State(meta): State<Arc<Meta>>, req: HttpRequest, next: Next) -> Response {
    let sent = req
        .headers()
        .get(CLUSTER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let theirs = sent.as_deref().and_then(drove_types::ClusterId::from_hex);
    if theirs == Some(meta.cluster) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let named = sent.unwrap_or_else(|| "none".to_string());
    tracing::warn!(%path, cluster = %named, "refused an internal call from another cluster");
    let msg = format!(
        "Refused: the call names cluster {named}, this node belongs to cluster {}",
        meta.cluster
    );
    (
        StatusCode::FORBIDDEN,
        Json(Wire::<()>::Err {
            kind: drove_types::ErrorKind::Invalid,
            msg,
        }),
    )
        .into_response()
}

async fn append(
    State(meta): State<Arc<Meta>>,
    Json(req): Json<AppendEntriesRequest<TypeConfig>>,
) -> Json<Result<AppendEntriesResponse<u64>, RaftError<u64>>> {
    Json(meta.raft.append_entries(req).await)
}

async fn vote(
    State(meta): State<Arc<Meta>>,
    Json(req): Json<VoteRequest<u64>>,
) -> Json<Result<VoteResponse<u64>, RaftError<u64>>> {
    Json(meta.raft.vote(req).await)
}

async fn snapshot(
    State(meta): State<Arc<Meta>>,
    Json(req): Json<InstallSnapshotRequest<TypeConfig>>,
) -> Json<Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>> {
    Json(meta.raft.install_snapshot(req).await)
}

async fn write(State(meta): State<Arc<Meta>>, Json(req): Json<Request>) -> Json<Wire<Written>> {
    if meta.is_closed() {
        return Json(Wire::unavailable("Metadata service stopped"));
    }
    Json(meta.local_write_within(req, SERVE_TIMEOUT).await)
}

async fn join(State(meta): State<Arc<Meta>>, Json(req): Json<JoinRequest>) -> Json<Wire<Role>> {
    Json(meta.handle_join(req).await)
}

async fn remove(State(meta): State<Arc<Meta>>, Json(id): Json<u64>) -> Json<Wire<()>> {
    Json(meta.handle_remove(id).await)
}
