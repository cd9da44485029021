//! Space views, as `ceph df` and `rbd du` give them: `drove node df` (each node's
//! disk and what drove stores on it), `drove cluster df` (the same per zone and in
//! all, and what the copies cost) and `drove vdi du` (bytes allocated per VDI and
//! snapshot, on all replicas and per copy). Every up node is asked for its store's
//! use (`/api/usage`) and its disk (`/api/local/health`); a node that does not answer
//! is shown as such, never counted as empty.
use anyhow::Result;
use drove_daemon::api::{LocalHealth, Status, Usage};
use drove_types::{format_size, NodeState, VdiId, VdiInfo};
use serde::Serialize;
use std::collections::BTreeMap;

use crate::client::{print_json, Ctx};
use crate::table;

/// One node's space, as `node df --json` prints it.
#[derive(Serialize, Clone)]
pub struct NodeSpace {
    pub node: u64,
    pub zone: String,
    /// `up`, `down`, ... as in the cluster map.
    pub state: String,
    /// Whether the node answered: without it, the byte counts are null.
    pub answered: bool,
    /// Size of the filesystem holding its objects.
    pub disk_bytes: Option<u64>,
    /// Space left there for drove.
    pub free_bytes: Option<u64>,
    /// Bytes allocated by drove's objects on it.
    pub used_bytes: Option<u64>,
    /// Objects (replicas) stored on it.
    pub objects: Option<u64>,
    /// A witness: it holds no data, and `cluster df` leaves it out of the sums.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub witness: bool,
}

/// What every node said, and the per-VDI use summed over the nodes that answered.
struct Survey {
    nodes: Vec<NodeSpace>,
    /// Per VDI: bytes allocated and objects, over all replicas.
    by_vdi: BTreeMap<VdiId, (u64, u64)>,
}

async fn survey(ctx: &Ctx) -> Result<Survey> {
    let status: Status = ctx.get("/api/status").await?;
    let mut nodes = Vec::new();
    let mut by_vdi: BTreeMap<VdiId, (u64, u64)> = BTreeMap::new();
    for n in status.map.nodes.values() {
        let mut row = NodeSpace {
            node: n.id.0,
            zone: n.zone.clone(),
            state: format!("{:?}", n.state).to_lowercase(),
            answered: false,
            disk_bytes: None,
            free_bytes: None,
            used_bytes: None,
            objects: None,
            witness: n.witness,
        };
        if n.state != NodeState::Down {
            let usage = ctx.get_at::<Usage>(&n.admin_addr, "/api/usage").await;
            let health = ctx
                .get_at::<LocalHealth>(&n.admin_addr, "/api/local/health")
                .await;
            if let (Ok(u), Ok(h)) = (usage, health) {
                row.answered = true;
                row.disk_bytes = h.disk_bytes;
                row.free_bytes = h.disk_free_bytes;
                row.used_bytes = Some(u.vdis.iter().map(|v| v.bytes).sum());
                row.objects = Some(u.vdis.iter().map(|v| v.objects).sum());
                for v in u.vdis {
                    let e = by_vdi.entry(v.id).or_default();
                    e.0 += v.bytes;
                    e.1 += v.objects;
                }
            }
        }
        nodes.push(row);
    }
    Ok(Survey { nodes, by_vdi })
}

fn size_or_dash(b: Option<u64>) -> String {
    b.map_or_else(|| "-".to_string(), format_size)
}

fn pct(used: u64, total: u64) -> String {
    if total == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", used as f64 * 100.0 / total as f64)
}

fn missing_note(nodes: &[NodeSpace]) {
    let silent: Vec<String> = nodes
        .iter()
        .filter(|n| !n.answered)
        .map(|n| format!("{} ({})", n.node, n.state))
        .collect();
    if !silent.is_empty() {
        println!(
            "\nNot counted: nodes {} did not answer; their copies are missing from these sums",
            silent.join(", ")
        );
    }
}

/// `drove node df`.
pub async fn node_df(ctx: &Ctx) -> Result<()> {
    let s = survey(ctx).await?;
    if ctx.json {
        return print_json(&s.nodes);
    }
    let rows: Vec<Vec<String>> = s
        .nodes
        .iter()
        .map(|n| {
            let disk_used = match (n.disk_bytes, n.free_bytes) {
                (Some(d), Some(f)) => pct(d.saturating_sub(f), d),
                _ => "-".to_string(),
            };
            vec![
                n.node.to_string(),
                n.zone.clone(),
                if n.witness {
                    format!("{} (witness)", n.state)
                } else {
                    n.state.clone()
                },
                size_or_dash(n.disk_bytes),
                size_or_dash(n.free_bytes),
                disk_used,
                size_or_dash(n.used_bytes),
                n.objects.map_or_else(|| "-".to_string(), |o| o.to_string()),
            ]
        })
        .collect();
    table::print(
        &[
            "NODE",
            "ZONE",
            "STATE",
            "DISK",
            "FREE",
            "DISK USED",
            "DROVE USES",
            "OBJECTS",
        ],
        &rows,
    );
    missing_note(&s.nodes);
    Ok(())
}

/// One zone's (or the cluster's) sums, as `cluster df --json` prints them.
#[derive(Serialize, Default)]
pub struct ZoneSpace {
    pub zone: String,
    pub nodes: usize,
    pub nodes_answered: usize,
    pub disk_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub objects: u64,
}

/// `cluster df --json`.
#[derive(Serialize)]
pub struct ClusterSpace {
    pub zones: Vec<ZoneSpace>,
    pub total: ZoneSpace,
    /// Bytes of VDI data, each counted once (allocated bytes / copies, per VDI).
    pub data_bytes: u64,
    /// What drove uses on all disks for that data: `used_bytes` of the total.
    pub raw_bytes: u64,
    /// Extra bytes the copies take: `raw_bytes - data_bytes`.
    pub copies_cost_bytes: u64,
    /// Provisioned size of every VDI (what VMs see), snapshots included.
    pub provisioned_bytes: u64,
    /// Nodes that did not answer (their bytes are not in the sums).
    pub not_counted: Vec<u64>,
}

/// `drove cluster df`.
pub async fn cluster_df(ctx: &Ctx) -> Result<()> {
    let s = survey(ctx).await?;
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    let mut zones: BTreeMap<String, ZoneSpace> = BTreeMap::new();
    let mut total = ZoneSpace {
        zone: "all".to_string(),
        ..Default::default()
    };
    // A witness holds no copy and its disk is not the cluster's to fill.
    for n in s.nodes.iter().filter(|n| !n.witness) {
        let z = zones.entry(n.zone.clone()).or_insert_with(|| ZoneSpace {
            zone: n.zone.clone(),
            ..Default::default()
        });
        for t in [&mut *z, &mut total] {
            t.nodes += 1;
            if n.answered {
                t.nodes_answered += 1;
                t.disk_bytes += n.disk_bytes.unwrap_or(0);
                t.free_bytes += n.free_bytes.unwrap_or(0);
                t.used_bytes += n.used_bytes.unwrap_or(0);
                t.objects += n.objects.unwrap_or(0);
            }
        }
    }
    let data_bytes: u64 = vdis
        .iter()
        .map(|v| s.by_vdi.get(&v.id).map_or(0, |u| u.0) / u64::from(v.copies.max(1)))
        .sum();
    let raw_bytes = total.used_bytes;
    let out = ClusterSpace {
        zones: zones.into_values().collect(),
        data_bytes,
        raw_bytes,
        copies_cost_bytes: raw_bytes.saturating_sub(data_bytes),
        provisioned_bytes: vdis.iter().map(|v| v.size).sum(),
        not_counted: s
            .nodes
            .iter()
            .filter(|n| !n.answered)
            .map(|n| n.node)
            .collect(),
        total,
    };
    if ctx.json {
        return print_json(&out);
    }
    let row = |z: &ZoneSpace| {
        vec![
            z.zone.clone(),
            format!("{}/{}", z.nodes_answered, z.nodes),
            format_size(z.disk_bytes),
            format_size(z.free_bytes),
            pct(z.disk_bytes.saturating_sub(z.free_bytes), z.disk_bytes),
            format_size(z.used_bytes),
            z.objects.to_string(),
        ]
    };
    let mut rows: Vec<Vec<String>> = out.zones.iter().map(row).collect();
    rows.push(row(&out.total));
    table::print(
        &[
            "ZONE",
            "NODES",
            "DISK",
            "FREE",
            "DISK USED",
            "DROVE USES",
            "OBJECTS",
        ],
        &rows,
    );
    println!(
        "\nVDI data {} stored as {} on disks: the copies cost {} ({:.2}x); {} VDIs provision {}",
        format_size(out.data_bytes),
        format_size(out.raw_bytes),
        format_size(out.copies_cost_bytes),
        out.raw_bytes as f64 / out.data_bytes.max(1) as f64,
        vdis.len(),
        format_size(out.provisioned_bytes),
    );
    missing_note(&s.nodes);
    Ok(())
}

/// One VDI's row of `vdi du --json`.
#[derive(Serialize)]
pub struct VdiSpace {
    pub name: String,
    pub id: VdiId,
    /// `disk`, `snapshot` or `ephemeral`.
    pub kind: &'static str,
    /// Provisioned size.
    pub size_bytes: u64,
    pub copies: u8,
    /// Bytes allocated on all replicas.
    pub allocated_bytes: u64,
    /// `allocated_bytes / copies`: what one copy takes.
    pub per_copy_bytes: u64,
    /// Objects stored, over all replicas.
    pub objects: u64,
}

/// `drove vdi du [NAME]`: every VDI, or NAME and the snapshots it was made from.
pub async fn vdi_du(ctx: &Ctx, name: Option<&str>) -> Result<()> {
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    let chosen: Vec<&VdiInfo> = match name {
        None => vdis.iter().collect(),
        Some(n) => {
            let Some(v) = vdis.iter().find(|v| v.name == n) else {
                return Err(crate::fail::not_found(format!(
                    "No VDI named '{}'",
                    drove_types::shown(n)
                )));
            };
            // NAME, then its parents up the chain.
            crate::diff_plan::chain(&vdis, v)
        }
    };
    let s = survey(ctx).await?;
    let rows: Vec<VdiSpace> = chosen
        .iter()
        .map(|v| {
            let (bytes, objects) = s.by_vdi.get(&v.id).copied().unwrap_or_default();
            VdiSpace {
                name: v.name.clone(),
                id: v.id,
                kind: crate::vdi_cmd::kind(v),
                size_bytes: v.size,
                copies: v.copies,
                allocated_bytes: bytes,
                per_copy_bytes: bytes / u64::from(v.copies.max(1)),
                objects,
            }
        })
        .collect();
    if ctx.json {
        return print_json(&rows);
    }
    let mut table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.kind.to_string(),
                format_size(r.size_bytes),
                r.copies.to_string(),
                format_size(r.per_copy_bytes),
                format_size(r.allocated_bytes),
                r.objects.to_string(),
            ]
        })
        .collect();
    let (per_copy, all): (u64, u64) = rows.iter().fold((0, 0), |a, r| {
        (a.0 + r.per_copy_bytes, a.1 + r.allocated_bytes)
    });
    table_rows.push(vec![
        "<total>".to_string(),
        String::new(),
        format_size(rows.iter().map(|r| r.size_bytes).sum()),
        String::new(),
        format_size(per_copy),
        format_size(all),
        rows.iter().map(|r| r.objects).sum::<u64>().to_string(),
    ]);
    table::print(
        &[
            "NAME",
            "KIND",
            "SIZE",
            "COPIES",
            "USED",
            "ON ALL COPIES",
            "OBJECTS",
        ],
        &table_rows,
    );
    missing_note(&s.nodes);
    Ok(())
}
