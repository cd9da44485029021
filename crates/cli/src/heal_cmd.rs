//! Self-healing commands: `vdi check`, `vdi set-min-copies`, `cluster scrub`, and the
//! recovery part of `cluster status`.
use anyhow::{bail, Context, Result};
use clap::Args;
use drove_daemon::api::{Check, MinCopies, Recovery, Status, VdiDetail};
use drove_replica::{CheckReport, ScrubReport};
use drove_types::{format_size, NodeState};
use serde::Serialize;
use std::io::IsTerminal;
use std::time::Duration;

use crate::client::{print_json, Ctx};
use crate::table;
use crate::vdi_cmd::encode;

/// Checks and scrubs read every object: give them time.
const LONG: Duration = Duration::from_secs(3600);

#[derive(Args)]
pub struct CheckArgs {
    /// VDI name.
    pub name: String,
    /// Make replicas that differ identical (the copy kept is chosen as recovery
    /// chooses its source). Refused while the VDI is attached for writing; the
    /// repair holds the VDI's write lock while it runs, so a client attaching
    /// meanwhile waits for it (and its writes fail if it takes longer than a few
    /// seconds).
    #[arg(long)]
    pub repair: bool,
}

#[derive(Args)]
pub struct MinCopiesArgs {
    /// VDI name.
    pub name: String,
    /// 1..=copies; `default` for copies - 1 (at least 1).
    pub min_copies: String,
}

pub async fn check(a: CheckArgs, ctx: &Ctx) -> Result<()> {
    let path = format!("/api/vdis/{}/check", encode(&a.name));
    let r: CheckReport = ctx
        .post_long(&path, &Check { repair: a.repair }, LONG)
        .await?;
    if ctx.json {
        return print_json(&r);
    }
    println!(
        "VDI '{}': {} objects stored, {} with identical replicas, {} differing, {} with fewer replicas than copies (nodes down)",
        a.name,
        r.objects,
        r.identical,
        r.mismatched.len(),
        r.degraded
    );
    let rows: Vec<Vec<String>> = r
        .mismatched
        .iter()
        .map(|m| {
            let reps = m
                .replicas
                .iter()
                .map(|v| match v.digest {
                    None => format!("{}:no answer", v.node),
                    Some(d) if d.corrupt => format!("{}:corrupt", v.node),
                    Some(d) => format!(
                        "{}:{:08x}{}",
                        v.node,
                        d.crc,
                        if d.current { "" } else { "(recovering)" }
                    ),
                })
                .collect::<Vec<_>>()
                .join(" ");
            vec![
                m.oid.to_string(),
                reps,
                if m.repaired { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        table::print(&["OBJECT", "REPLICAS (node:crc32c)", "REPAIRED"], &rows);
    }
    let unrepaired = r.mismatched.iter().filter(|m| !m.repaired).count();
    if unrepaired > 0 {
        if a.repair {
            bail!("{unrepaired} objects could not be repaired (see above)");
        }
        bail!("{unrepaired} objects have differing replicas; run with --repair once the VDI is detached");
    }
    Ok(())
}

pub async fn set_min_copies(a: MinCopiesArgs, ctx: &Ctx) -> Result<()> {
    let min_copies = match a.min_copies.as_str() {
        "default" => None,
        n => match n.parse::<u8>() {
            Ok(v) => Some(v),
            Err(_) => {
                return Err(crate::fail::invalid(format!(
                    "Bad min-copies '{n}': use a number from 1 to the VDI's copies, or 'default'"
                )))
            }
        },
    };
    let path = format!("/api/vdis/{}/min-copies", encode(&a.name));
    let d: VdiDetail = ctx.post(&path, &MinCopies { min_copies }).await?;
    if ctx.json {
        return print_json(&d);
    }
    println!(
        "VDI '{}': writes need {} of {} copies while replicas are down",
        d.info.name,
        d.info.min_copies(),
        d.info.copies
    );
    Ok(())
}

#[derive(Serialize)]
struct NodeScrub {
    node: u64,
    report: Option<ScrubReport>,
    error: Option<String>,
}

/// `drove cluster scrub`: every up node verifies every object it stores.
pub async fn scrub(ctx: &Ctx) -> Result<()> {
    let s: Status = ctx.get("/api/status").await?;
    let mut out = Vec::new();
    for n in s.map.nodes.values().filter(|n| n.state == NodeState::Up) {
        if !ctx.json {
            eprintln!("scrubbing node {} ...", n.id);
        }
        let res: Result<ScrubReport> = ctx
            .post_at_long(&n.admin_addr, "/api/scrub", &serde_json::json!({}), LONG)
            .await;
        out.push(match res {
            Ok(r) => NodeScrub {
                node: n.id.0,
                report: Some(r),
                error: None,
            },
            Err(e) => NodeScrub {
                node: n.id.0,
                report: None,
                error: Some(format!("{e:#}")),
            },
        });
    }
    if ctx.json {
        return print_json(&out);
    }
    let rows: Vec<Vec<String>> = out
        .iter()
        .map(|n| match (&n.report, &n.error) {
            (Some(r), _) => vec![
                n.node.to_string(),
                r.objects.to_string(),
                r.corrupt.to_string(),
                r.repaired.to_string(),
                String::new(),
            ],
            (None, e) => vec![
                n.node.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                e.clone().unwrap_or_default(),
            ],
        })
        .collect();
    table::print(&["NODE", "OBJECTS", "CORRUPT", "REPAIRED", "ERROR"], &rows);
    if out.iter().any(|n| n.error.is_some()) {
        bail!("some nodes could not be scrubbed");
    }
    Ok(())
}

/// Recovery progress of every up node (nodes that do not answer are left out).
pub async fn recovery(ctx: &Ctx, s: &Status) -> Vec<Recovery> {
    let mut out = Vec::new();
    for n in s.map.nodes.values().filter(|n| n.state == NodeState::Up) {
        if let Ok(r) = ctx.get_at::<Recovery>(&n.admin_addr, "/api/recovery").await {
            out.push(r);
        }
    }
    out
}

fn bar(done: u64, total: u64) -> String {
    const W: u64 = 20;
    let filled = (done * W).checked_div(total).unwrap_or(W);
    format!(
        "[{}{}]",
        "#".repeat(filled as usize),
        ".".repeat((W - filled) as usize)
    )
}

/// The recovery table of `cluster status`.
pub fn print_recovery(rs: &[Recovery]) {
    let tty = std::io::stdout().is_terminal();
    let rows: Vec<Vec<String>> = rs
        .iter()
        .map(|r| {
            let p = &r.progress;
            let state = if p.clean {
                "current".to_string()
            } else if p.waiting_full > 0 {
                format!(
                    "held back: disk {:.0}% full; {} wait for room",
                    p.disk_used_pct.unwrap_or(0.0),
                    p.waiting_full
                )
            } else if p.waiting_noout > 0 {
                format!("recovering; {} wait for noout off", p.waiting_noout)
            } else {
                "recovering".to_string()
            };
            let eta = match p.eta_s {
                Some(s) if !p.clean => format!("{s:.0}s"),
                Some(_) => "-".into(),
                None => "?".into(),
            };
            let mut done = format!("{}/{}", p.done, p.total);
            if tty {
                done = format!("{} {done}", bar(p.done, p.total));
            }
            vec![
                r.node_id.to_string(),
                p.epoch.to_string(),
                state,
                done,
                format_size(p.bytes),
                format!("{}/s", format_size(p.rate_bytes_s as u64)),
                eta,
            ]
        })
        .collect();
    table::print(
        &[
            "NODE", "EPOCH", "RECOVERY", "OBJECTS", "COPIED", "RATE", "ETA",
        ],
        &rows,
    );
}

/// `drove node remove ID`: forget a down node.
pub async fn remove(ctx: &Ctx, id: u64) -> Result<()> {
    let s: Status = ctx.get("/api/status").await?;
    if let Some(n) = s.map.node(drove_types::NodeId(id)) {
        if n.state == NodeState::Up {
            bail!(
                "node {id} is up: `drove node leave {id}` drains it, then removes it \
                 (`node remove` is for a node that is down for good)"
            );
        }
    }
    let v: serde_json::Value = ctx
        .post(&format!("/api/nodes/{id}/remove"), &serde_json::json!({}))
        .await?;
    if ctx.json {
        return print_json(&v);
    }
    println!("node {id} removed from the cluster map and the metadata membership");
    Ok(())
}

/// `drove node leave ID`: start the drain, wait until every up node is current at
/// the new epoch and the leaving node stores nothing, then remove the node.
pub async fn leave(ctx: &Ctx, id: u64, no_wait: bool) -> Result<()> {
    let node: drove_types::NodeInfo = ctx
        .post(&format!("/api/nodes/{id}/leave"), &serde_json::json!({}))
        .await?;
    let down = node.state != NodeState::Up;
    if !ctx.json {
        if node.witness {
            println!("node {id} is a witness and holds no objects: nothing to copy");
        } else {
            println!("node {id}: weight 0, its objects are being copied to the other nodes");
        }
    }
    if no_wait {
        return if ctx.json { print_json(&node) } else { Ok(()) };
    }
    // indicatif draws only on a terminal.
    let progress = if ctx.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(0)
    };
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("[{bar:20}] {pos}/{len} objects copied, node {msg}")
    {
        progress.set_style(style.progress_chars("#>."));
    }
    let started = std::time::Instant::now();
    loop {
        let s: Status = ctx.get("/api/status").await?;
        let rec = recovery(ctx, &s).await;
        let epoch = s.map.epoch.0;
        let (done, total) = rec
            .iter()
            .filter(|r| r.node_id.0 != id)
            .fold((0, 0), |(d, t), r| {
                (d + r.progress.done, t + r.progress.total)
            });
        let current = rec
            .iter()
            .all(|r| r.progress.clean && r.progress.epoch == epoch);
        let left = rec
            .iter()
            .find(|r| r.node_id.0 == id)
            .map(|r| r.local_objects);
        progress.set_length(total);
        progress.set_position(done);
        progress.set_message(format!(
            "{id} still holds {}",
            left.map(|n| n.to_string()).unwrap_or_else(|| "?".into())
        ));
        // A down node's copies are not sources and it cannot report: only the
        // others' recovery counts.
        if current && (left == Some(0) || down) {
            break;
        }
        if started.elapsed() > Duration::from_secs(24 * 3600) {
            bail!("node {id} has not drained after a day");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    progress.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let _: serde_json::Value = ctx
        .post(&format!("/api/nodes/{id}/remove"), &serde_json::json!({}))
        .await
        .with_context(|| format!("node {id} is drained but could not be removed"))?;
    if ctx.json {
        return print_json(
            &serde_json::json!({ "node": id, "drained": true, "removed": true, "seconds": secs }),
        );
    }
    println!(
        "node {id} drained in {secs:.1} s and removed from the cluster; its process can be stopped"
    );
    Ok(())
}
