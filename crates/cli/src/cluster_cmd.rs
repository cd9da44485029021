//! `drove cluster ...`: status and settings.
use anyhow::Result;
use clap::{Subcommand, ValueEnum};
use drove_daemon::api::{Health, Settings, Status};

use crate::client::{print_json, Ctx};
use crate::table;

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Nodes, metadata leader, epoch and its history, and recovery progress. Starts
    /// and ends with a WARNING when the answering node has not known of a working
    /// metadata majority for 3 s: what it shows is then its last view, maybe out of
    /// date (`confirmed: false` and `quorum_age_ms` under --json).
    Status,
    /// One verdict, OK, WARN or ERR, with its reasons: metadata quorum, nodes down,
    /// recovery (objects below their copies), disks near full, clock differences and
    /// the lag of zone-sync VDIs. Exit code 0 (OK), 1 (WARN) or 2 (ERR, also when no
    /// node answers), for monitoring checks.
    Health,
    /// Space per zone and in all: disks, free space, what drove stores, and what the
    /// copies cost (VDI data counted once against the bytes on all disks).
    Df,
    /// Show or change cluster settings.
    Config {
        /// Copies of VDIs created without --copies (1..=5).
        #[arg(long)]
        copies: Option<u8>,
        /// Mark a node down after this many seconds without a heartbeat (e.g. 5, 0.5).
        #[arg(long)]
        down_after: Option<f64>,
        /// Recovery copy rate limit per node in MiB/s (0: no limit).
        #[arg(long)]
        recovery_rate: Option<u32>,
        /// Seconds a node that a gateway found silent (it stopped answering) stays
        /// down at least, whatever its heartbeats say (0 to 86400; default 60).
        #[arg(long)]
        hold_down: Option<f64>,
        /// Recovery stops copying onto a node whose disk is this full, in percent
        /// of its size (1 to 100; default 90; 100: never): copies that only restore
        /// redundancy leave the last space to clients' writes. Ceph's backfillfull.
        #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u8).range(1..=100))]
        backfill_full: Option<u8>,
        /// The I/O limits new VDIs start with (their own flags at `vdi create`
        /// change them; VDIs made before keep theirs).
        #[command(flatten, next_help_heading = "Default I/O limits of new VDIs")]
        qos: crate::qos_cmd::QosArgs,
    },
    /// Verify every block checksum of every object on every up node and repair bad
    /// copies from good replicas.
    Scrub,
    /// Set a cluster flag. `noout on` before maintenance that keeps nodes down
    /// longer than the failure timeout (a host reboot): they are still marked down
    /// and left out of reads and writes, but what they hold is not copied to other
    /// nodes; back up, they catch up on what changed. `noout off` after it (while
    /// it is set, `cluster health` warns and down nodes' objects stay below their
    /// copies).
    Set {
        /// The flag.
        flag: Flag,
        /// on or off.
        value: OnOff,
    },
    /// A rolling upgrade: the cluster's feature level and each node's build
    /// (`status`), and raising the level once every node runs the new build
    /// (`finish`). Until then, what the new build brought is refused.
    Upgrade {
        #[command(subcommand)]
        cmd: crate::upgrade_cmd::UpgradeCmd,
    },
}

/// Cluster flags `drove cluster set` changes.
#[derive(Clone, Copy, ValueEnum)]
pub enum Flag {
    /// Down nodes are not re-replicated while set.
    Noout,
}

/// A flag's new value.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Set.
    On,
    /// Clear.
    Off,
}

/// Why the answering node's view cannot be trusted as current, if it cannot: it has
/// not known of a working metadata majority for a while (or ever).
fn unconfirmed(s: &Status) -> Option<String> {
    let fresh = drove_daemon::api::QUORUM_FRESH.as_millis() as u64;
    let stale = "the leader, node states and VDIs shown are its last view and may be out of date (no metadata majority reachable?)";
    match s.quorum_age_ms {
        Some(ms) if ms < fresh => None,
        Some(ms) => Some(format!(
            "node {} last knew of a working metadata majority {:.1} s ago: {stale}",
            s.node_id,
            ms as f64 / 1000.0
        )),
        None => Some(format!(
            "node {} has not known of a working metadata majority since it started: {stale}",
            s.node_id
        )),
    }
}

pub async fn run(cmd: ClusterCmd, ctx: &Ctx) -> Result<()> {
    match cmd {
        ClusterCmd::Status => {
            let s: Status = ctx.get("/api/status").await?;
            let unconfirmed = unconfirmed(&s);
            if ctx.json {
                let rec = crate::heal_cmd::recovery(ctx, &s).await;
                let mut v = serde_json::to_value(&s)?;
                v["recovery"] = serde_json::to_value(&rec)?;
                v["confirmed"] = serde_json::Value::Bool(unconfirmed.is_none());
                return print_json(&v);
            }
            if let Some(why) = &unconfirmed {
                println!("WARNING: {why}");
            }
            let leader = s
                .leader
                .map(|l| l.to_string())
                .unwrap_or_else(|| "none".into());
            println!("cluster {}", s.cluster_id);
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
            println!("feature level {}", s.feature_level);
            if s.noout {
                println!("flags: noout (down nodes are not re-replicated; `drove cluster set noout off` clears it)");
            }
            println!();
            crate::node_cmd::print_nodes(&s);
            println!();
            let rec = crate::heal_cmd::recovery(ctx, &s).await;
            crate::heal_cmd::print_recovery(&rec);
            println!();
            let rows: Vec<Vec<String>> = s
                .epoch_history
                .iter()
                .map(|e| vec![e.epoch.to_string(), e.at_unix.to_string(), e.change.clone()])
                .collect();
            table::print(&["EPOCH", "AT (unix)", "CHANGE"], &rows);
            if let Some(from) = s.maps_from {
                println!(
                    "maps kept from epoch {from} (trimmed once every node is up and clean at the current epoch)"
                );
            }
            if let Some(why) = &unconfirmed {
                println!();
                println!("WARNING: {why}");
            }
            Ok(())
        }
        ClusterCmd::Health => health(ctx).await,
        ClusterCmd::Upgrade { cmd } => crate::upgrade_cmd::run(cmd, ctx).await,
        ClusterCmd::Df => crate::df_cmd::cluster_df(ctx).await,
        ClusterCmd::Config {
            copies,
            down_after,
            recovery_rate,
            hold_down,
            backfill_full,
            qos,
        } => {
            let qos = qos.parse()?;
            let hold_down_ms = match hold_down {
                Some(secs) if !(0.0..=86400.0).contains(&secs) => {
                    return Err(crate::fail::invalid(format!(
                        "Bad --hold-down {secs}: use 0 to 86400 seconds"
                    )))
                }
                Some(secs) => Some((secs * 1000.0) as u64),
                None => None,
            };
            let down_after_ms = match down_after {
                Some(secs) if !(0.5..=3600.0).contains(&secs) => {
                    return Err(crate::fail::invalid(format!(
                        "Bad --down-after {secs}: use 0.5 to 3600 seconds"
                    )))
                }
                Some(secs) => Some((secs * 1000.0) as u64),
                None => None,
            };
            let s: Settings = ctx
                .post(
                    "/api/settings",
                    &Settings {
                        default_copies: copies,
                        down_after_ms,
                        recovery_mib_s: recovery_rate,
                        hold_down_ms,
                        noout: None,
                        backfill_full_pct: backfill_full,
                        default_qos: (!qos.is_empty_change()).then_some(qos),
                        feature_level: None,
                    },
                )
                .await?;
            if ctx.json {
                return print_json(&s);
            }
            println!("default copies: {}", s.default_copies.unwrap_or(0));
            println!(
                "down after:     {:.1} s",
                s.down_after_ms.unwrap_or(0) as f64 / 1000.0
            );
            match s.recovery_mib_s {
                Some(0) => println!("recovery rate:  no limit"),
                Some(r) => println!("recovery rate:  {r} MiB/s per node"),
                None => {}
            }
            println!(
                "hold down:      {:.1} s (a node found silent stays down at least this long)",
                s.hold_down_ms.unwrap_or(0) as f64 / 1000.0
            );
            if let Some(pct) = s.backfill_full_pct {
                println!("backfill full:  {pct} % (recovery stops copying onto a disk this full)");
            }
            if s.noout == Some(true) {
                println!("noout:          on (down nodes are not re-replicated)");
            }
            if let Some(q) = s.default_qos {
                println!("new VDIs' I/O:  {}", q.describe());
            }
            Ok(())
        }
        ClusterCmd::Scrub => crate::heal_cmd::scrub(ctx).await,
        ClusterCmd::Set {
            flag: Flag::Noout,
            value,
        } => {
            let s: Settings = ctx
                .post(
                    "/api/settings",
                    &Settings {
                        noout: Some(value == OnOff::On),
                        ..Default::default()
                    },
                )
                .await?;
            if ctx.json {
                return print_json(&s);
            }
            if s.noout == Some(true) {
                println!("noout: on (down nodes are not re-replicated; `drove cluster set noout off` after the maintenance)");
            } else {
                println!("noout: off (down nodes are re-replicated)");
            }
            Ok(())
        }
    }
}

/// `drove cluster health`: print the verdict and exit 0, 1 or 2 by it.
async fn health(ctx: &Ctx) -> Result<()> {
    let h: Health = match ctx.get("/api/health").await {
        Ok(h) => h,
        Err(e) => {
            // Nobody to judge: that is an error for a monitoring check too.
            let message = format!("no answer from the node asked: {e:#}");
            if ctx.json {
                print_json(&serde_json::json!({
                    "status": "err",
                    "node_id": null,
                    "quorum_age_ms": null,
                    "checks": [{ "level": "err", "check": "reach", "message": message }],
                }))?;
            } else {
                println!("ERR");
                println!("  ERR   reach     {message}");
            }
            finish(2);
        }
    };
    if ctx.json {
        print_json(&h)?;
    } else {
        println!("{} (judged by node {})", h.status.word(), h.node_id);
        for c in &h.checks {
            println!("  {:<5} {:<9} {}", c.level.word(), c.check, c.message);
        }
    }
    finish(h.status.exit_code())
}

/// Exit with `code` once what was printed is out.
fn finish(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}
