//! `drove cluster upgrade ...`: the cluster's feature level during a rolling upgrade.
//! `status` shows the level and each node's build; `finish`, once every node runs
//! the new build, raises the level so that what the new build brought may be used.
use anyhow::Result;
use clap::Subcommand;
use drove_daemon::api::Upgrade;

use crate::client::{print_json, Ctx, Refused};
use crate::table;

/// `drove cluster upgrade` subcommands.
#[derive(Subcommand)]
pub enum UpgradeCmd {
    /// The cluster's feature level and each node's build (version, and the newest
    /// level it knows). Commands of a level above the cluster's are refused.
    Status,
    /// Raise the cluster's feature level to this build's, once every node runs a
    /// build that knows it (refused, naming the nodes left, before that). From then
    /// on nodes of older builds can no longer join, and what the new level brought
    /// (level 2: per-VDI I/O limits; level 3: gateways' verdicts checked against
    /// their judge's view; level 4: and against their judge's zone) may be used.
    /// Nothing to do when already there.
    Finish,
}

pub async fn run(cmd: UpgradeCmd, ctx: &Ctx) -> Result<()> {
    let u: Upgrade = match cmd {
        UpgradeCmd::Status => ctx.get("/api/cluster/upgrade").await,
        UpgradeCmd::Finish => {
            ctx.post("/api/cluster/upgrade/finish", &serde_json::json!({}))
                .await
        }
    }
    .map_err(older_node)?;
    if ctx.json {
        return print_json(&u);
    }
    match u.was {
        Some(was) if was < u.feature_level => println!(
            "Cluster feature level raised from {was} to {} ({} may be used); nodes of builds \
             older than level {} can no longer join.",
            u.feature_level,
            drove_types::feature_name(u.feature_level),
            u.feature_level
        ),
        Some(_) => println!(
            "The cluster is already at feature level {} (this build knows {}): nothing to do.",
            u.feature_level, u.this_build
        ),
        None => {
            println!(
                "cluster feature level {} (the answering node's build knows {})",
                u.feature_level, u.this_build
            );
            let rows: Vec<Vec<String>> = u
                .nodes
                .iter()
                .map(|n| {
                    vec![
                        n.id.to_string(),
                        n.zone.clone(),
                        n.features.to_string(),
                        if n.version.is_empty() {
                            "(before feature levels)".to_string()
                        } else {
                            n.version.clone()
                        },
                    ]
                })
                .collect();
            table::print(&["NODE", "ZONE", "KNOWS LEVEL", "VERSION"], &rows);
            // The level every node knows: the lowest any node's build knows.
            let all_know = u.nodes.iter().map(|n| n.features).min().unwrap_or(0);
            if all_know > u.feature_level {
                println!(
                    "Every node knows level {all_know}: run `drove cluster upgrade finish` to use {}.",
                    drove_types::feature_name(all_know)
                );
            } else if u.nodes.iter().any(|n| n.features < u.this_build) {
                println!(
                    "Nodes below level {} are left to upgrade; then `drove cluster upgrade finish`.",
                    u.this_build
                );
            }
        }
    }
    Ok(())
}

/// A node of a build from before feature levels has no upgrade routes: its "not
/// found" says so, instead of a bare "Not Found".
fn older_node(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<Refused>() {
        Some(r) if r.kind == "not_found" => Refused {
            kind: r.kind.clone(),
            message: "The node asked runs a drove build from before cluster feature levels \
                      (it is at level 1 and has no `cluster upgrade`): ask a node that runs \
                      the new build (--cluster), or upgrade this one first"
                .to_string(),
        }
        .into(),
        _ => e,
    }
}
