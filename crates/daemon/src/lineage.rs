//! The admin API of a VDI's life cycle: snapshot, clone, rollback, flatten, and what
//! every VDI takes on this node's disk (for `drove vdi tree`).
//!
//! A snapshot must fall between two writes of the VDI's writer. When this node holds
//! the VDI's lock, its volume pauses writes, flushes and proposes the snapshot
//! itself; when another live node holds it, the metadata refuses and the CLI asks
//! that node. A lock left by a dead gateway is settled first (its replicas made
//! identical), exactly as before serving the VDI again.
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use drove_meta::{Command, Meta};
use drove_types::{Error, Result, VdiInfo};
use std::time::Duration;

use crate::admin::{expect_vdi, Admin, ApiErr};
use crate::api;
use drove_types::clock::unix_ms as now_ms;

type ApiResult<T> = std::result::Result<Json<T>, ApiErr>;

/// The life-cycle routes.
pub fn router() -> Router<Admin> {
    Router::new()
        .route("/api/vdis/{name}/snapshot", post(snapshot))
        .route("/api/vdis/{name}/clone", post(clone_vdi))
        .route("/api/vdis/{name}/rollback", post(rollback))
        .route("/api/vdis/{name}/flatten", post(flatten))
        .route("/api/usage", get(usage))
        .route("/api/local/objects", get(local_objects))
}

/// Wait until this node's metadata has applied `info` (the leader answered a
/// command; a follower applies it a moment later), and return it with its parents.
async fn applied(meta: &Meta, info: &VdiInfo) -> Result<(VdiInfo, Vec<VdiInfo>)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let state = meta.state();
        if let Some(v) = state.vdis.get(&info.name).filter(|v| v.id == info.id) {
            return Ok((v.clone(), state.ancestors(v)));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::unavailable(format!(
                "VDI '{}' changed in the metadata, but this node has not applied it yet",
                info.name
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait until this node's metadata has VDI `name` (just created through the leader).
async fn visible(meta: &Meta, name: &str) -> Result<VdiInfo> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = meta.state().vdis.get(name) {
            return Ok(v.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::unavailable(format!(
                "VDI '{name}' was created, but this node has not applied it yet",
                name = drove_types::shown(name)
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn snapshot(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Snapshot>,
) -> ApiResult<api::Snapshotted> {
    let info = a.find_vdi(&name)?;
    let meta = a.meta.clone();
    let propose = || async {
        let cmd = Command::SnapshotVdi {
            name: name.clone(),
            snap: req.snap.clone(),
            by: meta.node_id(),
            now_ms: now_ms(),
        };
        applied(&meta, &expect_vdi(meta.execute(cmd).await?)?).await
    };
    // A volume here, holding a lease or not, is paused around the snapshot: one
    // between two leases may be taking the lock again right now, and a write it
    // then sent under the grant of the VDI's old id would land in the snapshot.
    let live = match a.exports.volume(&name) {
        Some(vol) => {
            if !vol.holds_lock() {
                a.exports.settle_crashed_writer(&info).await?;
            }
            vol.snapshot_with(propose).await?
        }
        None => {
            a.exports.settle_crashed_writer(&info).await?;
            propose().await?.0
        }
    };
    let snapshot = a.find_vdi(&req.snap)?;
    Ok(Json(api::Snapshotted {
        snapshot,
        vdi: live,
    }))
}

async fn clone_vdi(
    State(a): State<Admin>,
    Path(snap): Path<String>,
    Json(req): Json<api::Clone>,
) -> ApiResult<Vec<api::VdiDetail>> {
    let cmd = match &req.names[..] {
        [] => return Err(Error::invalid("Name at least one clone").into()),
        [name] => Command::CloneVdi {
            snap,
            name: name.clone(),
            ephemeral: req.ephemeral,
        },
        _ => Command::CloneMany {
            snap,
            names: req.names.clone(),
            ephemeral: req.ephemeral,
        },
    };
    a.meta.execute(cmd).await?;
    let mut out = Vec::with_capacity(req.names.len());
    for name in &req.names {
        // Answer once this node serves the clone: a client attaching here next must
        // find it, even when this node applies the log after the leader.
        out.push(a.detail(visible(&a.meta, name).await?));
    }
    Ok(Json(out))
}

async fn rollback(
    State(a): State<Admin>,
    Path(name): Path<String>,
    Json(req): Json<api::Rollback>,
) -> ApiResult<api::VdiDetail> {
    let reply = a
        .meta
        .execute(Command::RollbackVdi {
            name,
            snap: req.snap,
            now_ms: now_ms(),
        })
        .await?;
    Ok(Json(a.detail(expect_vdi(reply)?)))
}

async fn flatten(State(a): State<Admin>, Path(name): Path<String>) -> ApiResult<api::Flattened> {
    let info = a.find_vdi(&name)?;
    if info.parent.is_none() {
        return Ok(Json(api::Flattened {
            vdi: info,
            copied: 0,
        }));
    }
    if info.snapshot {
        return Err(Error::invalid(format!(
            "'{name}' is a snapshot (read-only): flatten its clones instead",
            name = drove_types::shown(&name)
        ))
        .into());
    }
    a.exports.settle_crashed_writer(&info).await?;
    // The volume clients here share: its lock and copy-up order cover both.
    let vol = a.exports.volume_or_open(&name)?;
    vol.attach();
    let res = vol.copy_up_all().await;
    vol.detach();
    let copied = res?;
    let reply = a
        .meta
        .execute(Command::Flattened {
            name: name.clone(),
            id: info.id,
        })
        .await?;
    let (vdi, parents) = applied(&a.meta, &expect_vdi(reply)?).await?;
    vol.set_info(vdi.clone(), parents);
    tracing::info!(vdi = %name, copied, "flattened");
    Ok(Json(api::Flattened { vdi, copied }))
}

/// `GET /api/local/objects?vdis=ID,ID,...`: the indexes of the objects of those VDI
/// ids this node stores, ascending, from one walk of the store (for `drove vdi
/// export-diff`: the union over the up nodes is every object the ids wrote).
async fn local_objects(
    State(a): State<Admin>,
    axum::extract::Query(q): axum::extract::Query<api::ObjectsQuery>,
) -> ApiResult<api::LocalObjects> {
    let mut vdis: std::collections::BTreeMap<drove_types::VdiId, Vec<u32>> =
        std::collections::BTreeMap::new();
    let parts: Vec<&str> = q.vdis.split(',').collect();
    if parts.len() > api::MAX_OBJECTS_QUERY_IDS {
        return Err(Error::invalid(format!(
            "{} VDI ids asked for: at most {}",
            parts.len(),
            api::MAX_OBJECTS_QUERY_IDS
        ))
        .into());
    }
    for part in parts {
        let id: u32 = part.trim().parse().map_err(|_| {
            Error::invalid(format!(
                "Bad VDI id '{part}' in vdis: use numbers, comma-separated"
            ))
        })?;
        vdis.insert(drove_types::VdiId(id), Vec::new());
    }
    let store = a.recoverer.store().clone();
    for o in drove_replica::local::blocking(&store, |s| s.list()).await? {
        if let Some(v) = vdis.get_mut(&o.vdi) {
            v.push(o.index);
        }
    }
    for v in vdis.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    Ok(Json(api::LocalObjects {
        node_id: a.meta.node_id(),
        vdis,
    }))
}

async fn usage(State(a): State<Admin>) -> ApiResult<api::Usage> {
    let store = a.recoverer.store().clone();
    let by_vdi = drove_replica::local::blocking(&store, |s| s.usage()).await?;
    Ok(Json(api::Usage {
        node_id: a.meta.node_id(),
        vdis: by_vdi
            .into_iter()
            .map(|(id, u)| api::VdiUsage {
                id,
                objects: u.objects,
                bytes: u.bytes,
            })
            .collect(),
    }))
}
