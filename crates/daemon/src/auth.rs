//! Who may call the admin API. A node started with `--admin-token-file` asks every
//! request for a bearer token (`Authorization: Bearer SECRET`) and checks its role
//! against what the request needs:
//! - `read-only`: every GET (status, health, lists, VDI info, usage, metrics);
//! - `operator`: also creating VDIs, snapshots and clones, checks and `vdi sync`;
//! - `admin`: everything else (delete, resize, rename, rollback, flatten, settings,
//!   nodes, locks, hand-over, promote, scrub) and the tokens themselves.
//!
//! The node's own token (the file's content) is an admin token; every node of a
//! cluster gets the same file, and nodes send it when they ask each other (health,
//! clients, lag, objects). Other tokens come from `drove token create`: the
//! metadata keeps their name, role and the SHA-256 of the secret, never the secret.
//! `/metrics` is served without a token when the node runs with `--open-metrics`.
//! Without `--admin-token-file` the admin API takes anyone, as before.
//!
//! Over HTTPS a request without a token may be let in by the client certificate
//! its connection presented (verified against the cluster CA): a node certificate
//! is an admin; a client certificate has the role of the token whose name is its
//! common name (`drove token create host-a --role operator` gives both a secret
//! and the certificate `host-a` that role); without such a token it has none.
use axum::extract::{Path, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use drove_meta::{Command, Role};
use drove_types::Error;

use crate::admin::{Admin, ApiResult};
use crate::api;
use crate::http_listen::PeerCert;

/// SHA-256 of `secret`, lowercase hex.
pub fn sha256_hex(secret: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they
/// differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The role a request needs (`None`: none, it is open).
pub fn required_role(method: &Method, path: &str, open_metrics: bool) -> Option<Role> {
    if path == "/metrics" && open_metrics {
        return None;
    }
    if path == "/api/tokens" || path.starts_with("/api/tokens/") {
        return Some(Role::Admin);
    }
    if method == Method::GET || method == Method::HEAD {
        return Some(Role::ReadOnly);
    }
    let vdi_op = path
        .strip_prefix("/api/vdis/")
        .or_else(|| path.strip_prefix("/api/local/vdis/"))
        .and_then(|rest| rest.split_once('/'))
        .map(|(_, op)| op);
    let operator = method == Method::POST
        && (path == "/api/vdis" || matches!(vdi_op, Some("snapshot" | "clone" | "check" | "sync")));
    Some(if operator {
        Role::Operator
    } else {
        Role::Admin
    })
}

/// The bearer token of a request, if it carries one.
fn bearer(req: &Request) -> Option<&str> {
    let v = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn refuse(status: StatusCode, error: &str, message: String) -> Response {
    let body = api::ApiError {
        error: error.to_string(),
        message,
    };
    (status, Json(body)).into_response()
}

/// The middleware: let a request through only with a token of a role high enough.
pub(crate) async fn check(State(a): State<Admin>, req: Request, next: Next) -> Response {
    let Some(own) = &a.token_sha256 else {
        return next.run(req).await;
    };
    let Some(need) = required_role(req.method(), req.uri().path(), a.open_metrics) else {
        return next.run(req).await;
    };
    let cert = req.extensions().get::<PeerCert>();
    let found = match (bearer(&req), cert) {
        (Some(token), _) => by_token(&a, own, token),
        (None, Some(cert)) => by_certificate(&a, cert),
        (None, None) => Err(
            "This node requires an admin API token: set DROVE_TOKEN to the secret, or \
             DROVE_TOKEN_FILE (or --token-file) to a file that holds it"
                .to_string(),
        ),
    };
    let (who, role) = match found {
        Ok(x) => x,
        Err(why) => {
            // Not a warning: anyone who reaches the port could fill the log.
            tracing::debug!(path = %req.uri().path(), "admin API: request refused (no role)");
            return refuse(StatusCode::UNAUTHORIZED, "unauthorized", why);
        }
    };
    if role < need {
        return refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{who} has the role {}; {} {} needs {}",
                role.name(),
                req.method(),
                req.uri().path(),
                need.name()
            ),
        );
    }
    next.run(req).await
}

/// Who a bearer token is and its role, or why it has none; `own` is the SHA-256
/// of the node's token.
fn by_token(a: &Admin, own: &str, token: &str) -> Result<(String, Role), String> {
    let h = sha256_hex(token);
    if same(&h, own) {
        return Ok(("the node's admin token".to_string(), Role::Admin));
    }
    match a.meta.state().token_by_hash(&h) {
        Some((name, role)) => Ok((
            format!("token '{name}'", name = drove_types::shown(name)),
            role,
        )),
        None => Err("Unknown or deleted admin API token".to_string()),
    }
}

/// Who a verified client certificate is and its role: a node's is an admin, a
/// client's has the role of the token of its name.
fn by_certificate(a: &Admin, cert: &PeerCert) -> Result<(String, Role), String> {
    let name = cert.name.as_deref().unwrap_or("");
    if cert.node {
        return Ok((
            format!("node certificate '{name}'", name = drove_types::shown(name)),
            Role::Admin,
        ));
    }
    match a.meta.state().tokens.get(name) {
        Some(t) if !name.is_empty() => Ok((
            format!("certificate '{name}'", name = drove_types::shown(name)),
            t.role,
        )),
        _ => Err(format!(
            "The client certificate '{name}' has no role on this node: send a token \
             (DROVE_TOKEN or DROVE_TOKEN_FILE), or give the certificate one with \
             `drove token create {name} --role read-only|operator|admin`",
            name = drove_types::shown(name)
        )),
    }
}

/// `/api/tokens` (list, create) and `/api/tokens/{name}` (delete).
pub(crate) fn router() -> Router<Admin> {
    Router::new()
        .route("/api/tokens", get(list).post(create))
        .route("/api/tokens/{name}", delete(remove))
}

async fn list(State(a): State<Admin>) -> ApiResult<Vec<api::TokenInfo>> {
    let state = a.meta.state();
    Ok(Json(
        state
            .tokens
            .iter()
            .map(|(name, t)| api::TokenInfo {
                name: name.clone(),
                role: t.role,
                created_ms: t.created_ms,
            })
            .collect(),
    ))
}

async fn create(
    State(a): State<Admin>,
    Json(req): Json<api::TokenCreate>,
) -> ApiResult<api::TokenCreated> {
    drove_meta::check_token_name(&req.name).map_err(Error::invalid)?;
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw)
        .map_err(|e| Error::unavailable(format!("No random bytes for a token: {e}")))?;
    let token = format!("drove_{}", hex(&raw));
    a.meta
        .execute(Command::AddToken {
            name: req.name.clone(),
            role: req.role,
            sha256: sha256_hex(&token),
        })
        .await?;
    tracing::warn!(name = %req.name, role = req.role.name(), "admin API token created");
    Ok(Json(api::TokenCreated {
        name: req.name,
        role: req.role,
        token,
    }))
}

async fn remove(State(a): State<Admin>, Path(name): Path<String>) -> ApiResult<serde_json::Value> {
    a.meta
        .execute(Command::RemoveToken { name: name.clone() })
        .await?;
    tracing::warn!(%name, "admin API token deleted");
    Ok(Json(serde_json::json!({ "deleted": name })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_each_route_needs_the_role_its_effect_calls_for() {
        let r = |m: Method, p: &str| required_role(&m, p, false);
        for p in [
            "/api/status",
            "/api/vdis",
            "/api/vdis/vm",
            "/metrics",
            "/api/local/health",
        ] {
            assert_eq!(r(Method::GET, p), Some(Role::ReadOnly), "{p}");
        }
        for p in [
            "/api/vdis",
            "/api/vdis/vm/snapshot",
            "/api/vdis/vm/clone",
            "/api/vdis/vm/check",
            "/api/vdis/vm/sync",
            "/api/local/vdis/vm/sync",
        ] {
            assert_eq!(r(Method::POST, p), Some(Role::Operator), "{p}");
        }
        for (m, p) in [
            (Method::DELETE, "/api/vdis/vm"),
            (Method::POST, "/api/vdis/vm/resize"),
            (Method::POST, "/api/vdis/vm/rollback"),
            (Method::POST, "/api/vdis/vm/lock/break"),
            // Who may attach a disk is the admin's to say.
            (Method::POST, "/api/vdis/vm/access"),
            (Method::POST, "/api/settings"),
            (Method::POST, "/api/nodes/2/leave"),
            (Method::POST, "/api/scrub"),
            (Method::GET, "/api/tokens"),
            (Method::POST, "/api/tokens"),
            (Method::DELETE, "/api/tokens/ci"),
            // A VDI named like an operator route's tail is still a delete.
            (Method::DELETE, "/api/vdis/snapshot"),
        ] {
            assert_eq!(r(m.clone(), p), Some(Role::Admin), "{m} {p}");
        }
        assert_eq!(required_role(&Method::GET, "/metrics", true), None);
        assert_eq!(
            required_role(&Method::GET, "/api/status", true),
            Some(Role::ReadOnly)
        );
    }

    #[test]
    fn test_hashes_and_comparison() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
    }

    #[test]
    fn test_the_bearer_token_is_read_from_the_header() {
        let req = |v: Option<&str>| {
            let mut b = axum::http::Request::builder().uri("/api/status");
            if let Some(v) = v {
                b = b.header(header::AUTHORIZATION, v);
            }
            b.body(axum::body::Body::empty()).unwrap()
        };
        assert_eq!(bearer(&req(Some("Bearer s3cret"))), Some("s3cret"));
        assert_eq!(bearer(&req(Some("bearer  s3cret "))), Some("s3cret"));
        assert_eq!(bearer(&req(Some("Basic dXNlcjpwdw=="))), None);
        assert_eq!(bearer(&req(Some("Bearer "))), None);
        assert_eq!(bearer(&req(None)), None);
    }
}
