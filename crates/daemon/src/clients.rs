//! Who has a VDI open, cluster-wide: every node lists the NBD clients attached
//! through it (`GET /api/local/vdis/{name}/clients`), and any node gathers those
//! lists from the up nodes (`GET /api/vdis/{name}/clients`). Nothing of this goes
//! through the metadata: attaching costs no Raft commit. Deleting a VDI asks first
//! and refuses while anyone has it open.
use axum::extract::{Path, State};
use axum::Json;
use drove_types::{Error, NodeId, NodeState, Result};
use futures::future::join_all;
use std::time::Duration;

use crate::admin::{Admin, ApiResult};
use crate::api::{Client, VdiClients};

/// How long a node is given to list its clients.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /api/local/vdis/{name}/clients`: the clients attached through this node.
pub(crate) async fn local_clients(
    State(a): State<Admin>,
    Path(name): Path<String>,
) -> ApiResult<Vec<Client>> {
    Ok(Json(a.exports.clients_of(&name)))
}

/// `GET /api/vdis/{name}/clients`: the clients attached through every up node.
pub(crate) async fn all_clients(
    State(a): State<Admin>,
    Path(name): Path<String>,
) -> ApiResult<VdiClients> {
    a.find_vdi(&name)?;
    Ok(Json(gather(&a, &name).await))
}

/// Ask every up node (this one directly) which clients have `name` open; nodes that
/// do not answer are listed as such.
pub(crate) async fn gather(a: &Admin, name: &str) -> VdiClients {
    let me = a.meta.node_id();
    let mut others = up_admins(a);
    others.retain(|(id, _)| *id != me);
    let http = &a.http;
    let asks = others.into_iter().map(|(id, addr)| async move {
        let url = a.url(&addr, &format!("/api/local/vdis/{}/clients", encode(name)));
        let res: Result<Vec<Client>> = ask(http.get(&url).timeout(ASK_TIMEOUT), &url).await;
        (id, res)
    });
    let mut out = VdiClients {
        clients: a.exports.clients_of(name),
        unreachable: Vec::new(),
    };
    for (id, res) in join_all(asks).await {
        match res {
            Ok(list) => out
                .clients
                .extend(list.into_iter().filter(|c| c.node == id)),
            Err(e) => {
                tracing::warn!(node = %id, "cannot list its clients of VDI '{name}': {e}");
                out.unreachable.push(id);
            }
        }
    }
    out.clients
        .sort_by(|x, y| (x.node, &x.client).cmp(&(y.node, &y.client)));
    out
}

/// The up nodes of this node's map and their admin addresses.
pub(crate) fn up_admins(a: &Admin) -> Vec<(NodeId, String)> {
    a.meta
        .state()
        .map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Up)
        .map(|n| (n.id, n.admin_addr.clone()))
        .collect()
}

/// Send `req` (to `url`) to another node's admin API and decode its JSON answer;
/// a failure to connect, a non-success status (with its body) or a bad answer is an
/// `Unavailable` error naming the URL.
pub(crate) async fn ask<T: serde::de::DeserializeOwned>(
    req: reqwest::RequestBuilder,
    url: &str,
) -> Result<T> {
    let resp = req
        .send()
        .await
        .map_err(|e| Error::unavailable(format!("{url}: {e}")))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        return Err(Error::unavailable(format!(
            "{url} answered {status}: {body}"
        )));
    }
    resp.json()
        .await
        .map_err(|e| Error::unavailable(format!("{url}: bad answer: {e}")))
}

/// Percent-encode a VDI name for a URL path (names are checked to be plain, but a
/// name is never trusted to be).
pub(crate) fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Refuse to delete `name` while a client has it open (or a node that may have one
/// does not answer), naming them.
pub(crate) async fn refuse_if_open(a: &Admin, name: &str) -> Result<()> {
    let found = gather(a, name).await;
    if found.clients.is_empty() && found.unreachable.is_empty() {
        return Ok(());
    }
    let mut who: Vec<String> = found
        .clients
        .iter()
        .map(|c| format!("{} through node {}", c.client, c.node))
        .collect();
    who.extend(
        found
            .unreachable
            .iter()
            .map(|n| format!("maybe clients of node {n}, which did not answer")),
    );
    Err(Error::new(
        drove_types::ErrorKind::Locked,
        format!(
            "VDI '{name}' is open: {}. Detach them first, or delete anyway with --force \
             (their I/O then fails)",
            who.join("; "),
            name = drove_types::shown(name)
        ),
    ))
}

/// How long a delete waits for the up nodes to drop the VDI's open volumes.
const DROP_PATIENCE: Duration = Duration::from_secs(5);

#[derive(serde::Deserialize)]
pub(crate) struct GoneQuery {
    id: u32,
}

/// `GET /api/local/vdis/{name}/gone?id=N`: whether this node has applied the deletion
/// of VDI `name` whose id was N (its record is gone and no volume of it is open, so
/// any client still attached gets I/O errors).
pub(crate) async fn local_gone(
    State(a): State<Admin>,
    Path(name): Path<String>,
    axum::extract::Query(q): axum::extract::Query<GoneQuery>,
) -> ApiResult<bool> {
    Ok(Json(dropped_here(&a, &name, drove_types::VdiId(q.id))))
}

/// This node has applied the deletion of VDI `name` (id `id`): no record, no volume.
fn dropped_here(a: &Admin, name: &str, id: drove_types::VdiId) -> bool {
    let recorded = a.meta.state().vdis.get(name).map(|v| v.id) == Some(id);
    let open = a.exports.volume(name).is_some_and(|v| v.info().id == id);
    !recorded && !open
}

/// After VDI `name` (id `id`) was deleted: wait (at most [`DROP_PATIENCE`]) until every
/// up node has applied it, so that when the delete returns no client anywhere reads
/// the old disk any more. Returns the nodes that had not confirmed in time.
pub(crate) async fn await_dropped(a: &Admin, name: &str, id: drove_types::VdiId) -> Vec<NodeId> {
    let deadline = tokio::time::Instant::now() + DROP_PATIENCE;
    let mut pending = up_admins(a);
    let me = a.meta.node_id();
    loop {
        let http = &a.http;
        let asks = pending.iter().map(|(node, addr)| async move {
            if *node == me {
                return dropped_here(a, name, id);
            }
            let url = a.url(
                addr,
                &format!("/api/local/vdis/{}/gone?id={}", encode(name), id.0),
            );
            match http.get(&url).timeout(ASK_TIMEOUT).send().await {
                Ok(r) if r.status().is_success() => r.json::<bool>().await.unwrap_or(false),
                _ => false,
            }
        });
        let done = join_all(asks).await;
        let mut i = 0;
        pending.retain(|_| {
            i += 1;
            !done[i - 1]
        });
        if pending.is_empty() || tokio::time::Instant::now() >= deadline {
            return pending.into_iter().map(|(n, _)| n).collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
