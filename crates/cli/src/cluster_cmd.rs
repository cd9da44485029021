//! `drove cluster ...`: status and settings.
use anyhow::Result;
use clap::Subcommand;
use drove_daemon::api::{Settings, Status};

use crate::client::{print_json, Ctx};
use crate::table;

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Nodes, metadata leader, epoch and its history.
    Status,
    /// Show or change cluster settings.
    Config {
        /// Copies of VDIs created without --copies (1..=5).
        #[arg(long)]
        copies: Option<u8>,
    },
}

pub async fn run(cmd: ClusterCmd, ctx: &Ctx) -> Result<()> {
    match cmd {
        ClusterCmd::Status => {
            let s: Status = ctx.get("/api/status").await?;
            if ctx.json {
                return print_json(&s);
            }
            let leader = s
                .leader
                .map(|l| l.to_string())
                .unwrap_or_else(|| "none".into());
            println!(
                "epoch {}  leader {}  term {}  voters {:?}  learners {:?}  VDIs {}  default copies {}",
                s.map.epoch,
                leader,
                s.term,
                s.voters.iter().map(|v| v.0).collect::<Vec<_>>(),
                s.learners.iter().map(|v| v.0).collect::<Vec<_>>(),
                s.vdi_count,
                s.default_copies
            );
            println!();
            crate::node_cmd::print_nodes(&s);
            println!();
            let rows: Vec<Vec<String>> = s
                .epoch_history
                .iter()
                .map(|e| vec![e.epoch.to_string(), e.at_unix.to_string(), e.change.clone()])
                .collect();
            table::print(&["EPOCH", "AT (unix)", "CHANGE"], &rows);
            Ok(())
        }
        ClusterCmd::Config { copies } => {
            let s: Settings = ctx
                .post(
                    "/api/settings",
                    &Settings {
                        default_copies: copies,
                    },
                )
                .await?;
            if ctx.json {
                return print_json(&s);
            }
            println!("default copies: {}", s.default_copies.unwrap_or(0));
            Ok(())
        }
    }
}
