//! The server side of the metadata's HTTP routes, served on the node's peer port (the
//! daemon hands it the connections that speak HTTP): Raft RPCs under `/raft/`
//! (answered by the local Raft whatever its role) and internal calls under `/meta/`
//! (answered only by the leader; see [`crate::remote`]). Bodies are JSON. The public
//! admin API carries only `GET /meta/hello`, which says where the internal routes are.
use crate::meta::Meta;
use crate::raft_checks;
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
        .route("/meta/write-batch", post(write_batch))
        .route("/meta/read-index", post(crate::read::serve))
        .route("/meta/renew", post(crate::lease::serve))
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

pub(crate) fn public_router(meta: Arc<Meta>) -> Router {
    Router::new()
        .route("/meta/hello", get(hello))
        .with_state(meta)
}

async fn hello(State(meta): State<Arc<Meta>>) -> Json<Hello> {
    Json(Hello {
        cluster: meta.cluster,
        node: meta.id,
        internal: Some(meta.cfg.addr.clone()),
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

/// This node's side of the Raft RPC checks.
fn own(meta: &Meta) -> raft_checks::Own {
    raft_checks::Own {
        term: meta.raft.metrics().borrow().current_term,
    }
}

/// A Raft RPC refused before openraft saw it.
fn refused(what: &str, why: String) -> Response {
    tracing::warn!("refused a Raft {what}: {why}");
    (StatusCode::BAD_REQUEST, format!("Refused {what}: {why}")).into_response()
}

async fn append(
    State(meta): State<Arc<Meta>>,
    Json(req): Json<AppendEntriesRequest<TypeConfig>>,
) -> Response {
    if let Err(why) = raft_checks::append(&req, own(&meta)) {
        return refused("append", why);
    }
    let res: Result<AppendEntriesResponse<u64>, RaftError<u64>> =
        meta.raft.append_entries(req).await;
    Json(res).into_response()
}

async fn vote(State(meta): State<Arc<Meta>>, Json(req): Json<VoteRequest<u64>>) -> Response {
    if let Err(why) = raft_checks::vote(&req, own(&meta)) {
        return refused("vote", why);
    }
    let res: Result<VoteResponse<u64>, RaftError<u64>> = meta.raft.vote(req).await;
    Json(res).into_response()
}

async fn snapshot(
    State(meta): State<Arc<Meta>>,
    Json(req): Json<InstallSnapshotRequest<TypeConfig>>,
) -> Response {
    if let Err(why) = raft_checks::snapshot(&req, own(&meta)) {
        return refused("snapshot", why);
    }
    let res: Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> =
        meta.raft.install_snapshot(req).await;
    Json(res).into_response()
}

async fn write(State(meta): State<Arc<Meta>>, Json(req): Json<Request>) -> Json<Wire<Written>> {
    if meta.is_closed() {
        return Json(Wire::unavailable("Metadata service stopped"));
    }
    Json(write_one(&meta, req).await)
}

/// `POST /meta/write-batch`: several forwarded commands (see [`crate::forward`]),
/// each proposed and answered as by `/meta/write`, in order.
async fn write_batch(
    State(meta): State<Arc<Meta>>,
    Json(reqs): Json<Vec<Request>>,
) -> Json<Wire<Vec<Wire<Written>>>> {
    if meta.is_closed() {
        return Json(Wire::unavailable("Metadata service stopped"));
    }
    if reqs.is_empty() || reqs.len() > crate::batch::MAX_BATCH {
        tracing::warn!(
            commands = reqs.len(),
            "refused a forwarded batch of a bad length"
        );
        return Json(Wire::Err {
            kind: drove_types::ErrorKind::Invalid,
            msg: format!(
                "A forwarded batch of {} commands (1 to {})",
                reqs.len(),
                crate::batch::MAX_BATCH
            ),
        });
    }
    let mut calls = tokio::task::JoinSet::new();
    for (i, req) in reqs.into_iter().enumerate() {
        let meta = meta.clone();
        calls.spawn(async move { (i, write_one(&meta, req).await) });
    }
    let mut answers: Vec<Option<Wire<Written>>> = vec![None; calls.len()];
    while let Some(done) = calls.join_next().await {
        if let Ok((i, a)) = done {
            answers[i] = Some(a);
        }
    }
    Json(Wire::Ok(
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Wire::unavailable("the write's task failed")))
            .collect(),
    ))
}

/// One forwarded command, checked and proposed on this node's Raft.
async fn write_one(meta: &Meta, req: Request) -> Wire<Written> {
    // The time in the log is the leader's, not the sender's: a sender cannot date a
    // lease or a verdict as it likes.
    let req = Request {
        now: crate::meta::unix_now(),
        ..req
    };
    // A history trim rests on what the leader heard from every node's heartbeats:
    // a node that sends one would make the others forget maps recovery may need.
    if matches!(
        req.cmd,
        crate::state::Command::Batch(_)
            | crate::state::Command::ExtendLeases { .. }
            | crate::state::Command::TrimHistory { .. }
    ) {
        tracing::warn!(
            kind = req.cmd.kind(),
            "refused a command from the network that only the leader makes"
        );
        return Wire::Err {
            kind: drove_types::ErrorKind::Invalid,
            msg: format!("{} is made by the leader, not sent to it", req.cmd.kind()),
        };
    }
    meta.local_write_within(req, SERVE_TIMEOUT).await
}

async fn join(State(meta): State<Arc<Meta>>, Json(req): Json<JoinRequest>) -> Json<Wire<Role>> {
    Json(meta.handle_join(req).await)
}

async fn remove(State(meta): State<Arc<Meta>>, Json(id): Json<u64>) -> Json<Wire<()>> {
    Json(meta.handle_remove(id).await)
}
