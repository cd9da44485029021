//! The metadata's internal routes as HTTP, served on the node's peer port (the
//! daemon hands it the connections that speak HTTP): every route hands its call to
//! [`Meta::serve`], the one dispatcher whatever carried the call (see
//! [`crate::net`]). The public admin API carries only `GET /meta/hello`, which says
//! where the internal routes are.
use crate::http_net::CLUSTER_HEADER;
use crate::meta::Meta;
use crate::net::Method;
use crate::serve::BODY_LIMIT;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

/// The internal routes, each answered by [`Meta::serve`].
const ROUTES: [&str; 10] = [
    "/raft/append",
    "/raft/vote",
    "/raft/snapshot",
    "/meta/write",
    "/meta/write-batch",
    "/meta/read-index",
    "/meta/renew",
    "/meta/join",
    "/meta/remove",
    "/meta/heartbeat",
];

pub(crate) fn router(meta: Arc<Meta>) -> Router {
    let mut internal = Router::new();
    for path in ROUTES {
        internal = internal.route(path, post(dispatch_post));
    }
    Router::new()
        .route("/meta/hello", get(dispatch_get))
        .merge(internal.layer(DefaultBodyLimit::max(BODY_LIMIT)))
        .with_state(meta)
}

pub(crate) fn public_router(meta: Arc<Meta>) -> Router {
    Router::new()
        .route("/meta/hello", get(dispatch_get))
        .with_state(meta)
}

async fn dispatch_get(State(meta): State<Arc<Meta>>, uri: Uri, headers: HeaderMap) -> Response {
    dispatch(&meta, Method::Get, &uri, &headers, &[]).await
}

async fn dispatch_post(
    State(meta): State<Arc<Meta>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    dispatch(&meta, Method::Post, &uri, &headers, &body).await
}

async fn dispatch(
    meta: &Arc<Meta>,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let cluster = headers.get(CLUSTER_HEADER).and_then(|v| v.to_str().ok());
    let answer = meta.serve(method, uri.path(), cluster, body).await;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = if answer.is_success() || answer.status == 403 {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    (
        status,
        [(axum::http::header::CONTENT_TYPE, kind)],
        answer.body,
    )
        .into_response()
}
