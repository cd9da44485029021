//! `drove vdi snapshot | clone | rollback | flatten | tree`, and `delete --flatten`:
//! a VDI's life cycle. Snapshots and clones are O(1) metadata changes; the data is
//! shared copy-on-write (see `crates/volume/src/cow.rs`).
use anyhow::Result;
use clap::Args;
use drove_daemon::api::{self, Snapshotted, VdiDetail};
use drove_types::{format_size, VdiId, VdiInfo};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::client::{print_json, Ctx};
use crate::vdi_cmd::encode;

/// A snapshot waits for the writer's in-flight writes and flush; a flatten copies
/// whole objects.
const LONG: Duration = Duration::from_secs(600);

#[derive(Args)]
pub struct SnapshotArgs {
    /// The VDI (it may be in use: the snapshot falls between two of its writes).
    pub name: String,
    /// Name of the read-only snapshot.
    pub snap: String,
}

#[derive(Args)]
pub struct CloneArgs {
    /// The snapshot to clone.
    pub snap: String,
    /// Name of the new VDI; several names make several clones in one step.
    #[arg(required = true)]
    pub names: Vec<String>,
    /// Delete the clone when the last client that wrote it detaches (a disk that
    /// lives as long as its VM).
    #[arg(long)]
    pub ephemeral: bool,
}

#[derive(Args)]
pub struct RollbackArgs {
    /// The VDI (no client may be writing it).
    pub name: String,
    /// One of its snapshots (see `drove vdi tree`).
    pub snap: String,
}

#[derive(Args)]
pub struct FlattenArgs {
    /// The clone: it gets its own copy of every object it reads from its parents.
    pub name: String,
}

/// The admin address of the node holding `name`'s write lock, if a node holds it.
async fn writer_of(ctx: &Ctx, name: &str) -> Result<Option<String>> {
    let d: VdiDetail = ctx.get(&format!("/api/vdis/{}", encode(name))).await?;
    let Some(lock) = d.lock else {
        return Ok(None);
    };
    let status: api::Status = ctx.get("/api/status").await?;
    Ok(status.map.node(lock.owner).map(|n| n.admin_addr.clone()))
}

/// POST to the node writing `name` (it must do the work between two writes), or to
/// the cluster address when none does or the writer does not answer (a dead writer's
/// lock is settled by whichever node takes the request).
async fn post_to_writer<B: serde::Serialize, T: serde::de::DeserializeOwned>(
    ctx: &Ctx,
    name: &str,
    path: &str,
    body: &B,
) -> Result<T> {
    if let Some(addr) = writer_of(ctx, name).await? {
        match ctx.post_at_long(&addr, path, body, LONG).await {
            Ok(v) => return Ok(v),
            Err(e) if e.to_string().starts_with("Cannot reach") => {}
            Err(e) => return Err(e),
        }
    }
    ctx.post_long(path, body, LONG).await
}

pub async fn snapshot(a: SnapshotArgs, ctx: &Ctx) -> Result<()> {
    let path = format!("/api/vdis/{}/snapshot", encode(&a.name));
    let s: Snapshotted =
        post_to_writer(ctx, &a.name, &path, &api::Snapshot { snap: a.snap }).await?;
    if ctx.json {
        return print_json(&s);
    }
    println!(
        "Snapshot '{}' of '{}' taken (read-only, {}); '{}' goes on as its copy-on-write child",
        s.snapshot.name,
        s.vdi.name,
        format_size(s.snapshot.size),
        s.vdi.name
    );
    Ok(())
}

pub async fn clone(a: CloneArgs, ctx: &Ctx) -> Result<()> {
    let made: Vec<VdiDetail> = ctx
        .post_long(
            &format!("/api/vdis/{}/clone", encode(&a.snap)),
            &api::Clone {
                names: a.names,
                ephemeral: a.ephemeral,
            },
            LONG,
        )
        .await?;
    if ctx.json {
        return print_json(&made);
    }
    for d in &made {
        let kind = if d.info.ephemeral {
            "ephemeral clone"
        } else {
            "clone"
        };
        println!(
            "Created {kind} '{}' of '{}' ({}): {}",
            d.info.name,
            a.snap,
            format_size(d.info.size),
            d.nbd_unix
        );
    }
    Ok(())
}

pub async fn rollback(a: RollbackArgs, ctx: &Ctx) -> Result<()> {
    let d: VdiDetail = ctx
        .post(
            &format!("/api/vdis/{}/rollback", encode(&a.name)),
            &api::Rollback {
                snap: a.snap.clone(),
            },
        )
        .await?;
    if ctx.json {
        return print_json(&d);
    }
    println!(
        "'{}' rolled back to snapshot '{}'; what it wrote since is discarded",
        d.info.name, a.snap
    );
    Ok(())
}

async fn flatten_one(ctx: &Ctx, name: &str) -> Result<api::Flattened> {
    let path = format!("/api/vdis/{}/flatten", encode(name));
    post_to_writer(ctx, name, &path, &serde_json::json!({})).await
}

pub async fn flatten(a: FlattenArgs, ctx: &Ctx) -> Result<()> {
    let f = flatten_one(ctx, &a.name).await?;
    if ctx.json {
        return print_json(&f);
    }
    println!(
        "'{}' flattened: {} objects copied from its parents; it reads nothing from them any more",
        f.vdi.name, f.copied
    );
    Ok(())
}

/// `vdi delete NAME --flatten`: flatten every clone of NAME, then delete it.
pub async fn delete_flattening(name: &str, ctx: &Ctx) -> Result<Vec<String>> {
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    let me = vdis.iter().find(|v| v.name == name).ok_or_else(|| {
        crate::fail::not_found(format!("No VDI named '{}'", drove_types::shown(name)))
    })?;
    // Deleted snapshots kept for their own readers are not flattened: they go
    // with them.
    let children: Vec<String> = vdis
        .iter()
        .filter(|v| v.parent == Some(me.id) && !drove_types::is_kept(&v.name))
        .map(|v| v.name.clone())
        .collect();
    for c in &children {
        if !ctx.json {
            eprintln!("flattening '{c}' ...");
        }
        flatten_one(ctx, c).await?;
    }
    Ok(children)
}

/// One line of the tree, for `--json`.
#[derive(serde::Serialize)]
struct TreeRow {
    #[serde(flatten)]
    info: VdiInfo,
    parent_name: Option<String>,
    children: Vec<String>,
    /// Objects of its own (not its parents'), over all replicas.
    objects: u64,
    /// Bytes its own objects take on disk, over all replicas.
    bytes_on_disk: u64,
}

pub async fn tree(ctx: &Ctx) -> Result<()> {
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    let status: api::Status = ctx.get("/api/status").await?;
    let mut used: BTreeMap<VdiId, (u64, u64)> = BTreeMap::new();
    let mut missing = Vec::new();
    for n in status.map.up_nodes() {
        match ctx.get_at::<api::Usage>(&n.admin_addr, "/api/usage").await {
            Ok(u) => {
                for v in u.vdis {
                    let e = used.entry(v.id).or_default();
                    e.0 += v.objects;
                    e.1 += v.bytes;
                }
            }
            Err(_) => missing.push(n.id.to_string()),
        }
    }
    let by_id: BTreeMap<VdiId, &VdiInfo> = vdis.iter().map(|v| (v.id, v)).collect();
    let rows: Vec<TreeRow> = vdis
        .iter()
        .map(|v| {
            let (objects, bytes_on_disk) = used.get(&v.id).copied().unwrap_or_default();
            TreeRow {
                info: v.clone(),
                parent_name: v.parent.and_then(|p| by_id.get(&p)).map(|p| p.name.clone()),
                children: vdis
                    .iter()
                    .filter(|c| c.parent == Some(v.id))
                    .map(|c| c.name.clone())
                    .collect(),
                objects,
                bytes_on_disk,
            }
        })
        .collect();
    if ctx.json {
        return print_json(&rows);
    }
    if !missing.is_empty() {
        eprintln!(
            "note: nodes {} did not answer; sizes leave them out",
            missing.join(", ")
        );
    }
    let by_name: BTreeMap<&str, &TreeRow> =
        rows.iter().map(|r| (r.info.name.as_str(), r)).collect();
    for r in rows.iter().filter(|r| r.parent_name.is_none()) {
        print_node(&by_name, r, "", "");
    }
    Ok(())
}

fn print_node(by_name: &BTreeMap<&str, &TreeRow>, r: &TreeRow, first: &str, rest: &str) {
    let kind = if drove_types::is_kept(&r.info.name) {
        "deleted snapshot, kept for what reads from it"
    } else if r.info.snapshot {
        "snapshot"
    } else if r.info.ephemeral {
        "ephemeral"
    } else {
        "disk"
    };
    println!(
        "{first}{}  [{kind}]  size {}  own data {} on disk ({} objects over {} copies)",
        drove_types::kept_original(&r.info.name).unwrap_or(&r.info.name),
        format_size(r.info.size),
        format_size(r.bytes_on_disk),
        r.objects,
        r.info.copies
    );
    for (i, c) in r.children.iter().enumerate() {
        let Some(child) = by_name.get(c.as_str()) else {
            continue;
        };
        let last = i + 1 == r.children.len();
        let (f, more) = if last {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        print_node(
            by_name,
            child,
            &format!("{rest}{f}"),
            &format!("{rest}{more}"),
        );
    }
}
