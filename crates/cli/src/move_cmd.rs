//! `drove vdi handover` (the write lock to another node; to a node of another zone,
//! the home zone follows) and `drove vdi promote` (a new home zone after the old one
//! was lost).
use anyhow::{bail, Result};
use clap::Args;
use drove_daemon::api::{Handover, Promote, VdiDetail};
use drove_types::{NodeId, WritePolicy};
use serde::Serialize;
use std::time::{Duration, Instant};

use crate::client::{print_json, Ctx};
use crate::vdi_cmd::encode;

#[derive(Args)]
pub struct HandoverArgs {
    /// VDI name.
    pub name: String,
    /// Node id that takes the lock. A node of another zone also becomes the VDI's
    /// home: its objects move to that zone in the background.
    #[arg(long)]
    pub to: u64,
    /// Return once asked, without waiting for the writer to release the lock.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting for the writer after this long, e.g. 30s or 5m (at most 60m).
    /// A zone-sync writer first ships its lag to the other zones.
    #[arg(long, value_name = "DURATION", default_value = "2m")]
    pub timeout: String,
}

/// What `drove vdi handover --json` prints.
#[derive(Serialize)]
struct HandoverReport {
    vdi: String,
    to: u64,
    /// Whether the old writer released the lock (true when nobody held it).
    released: bool,
    home_zone_before: Option<String>,
    home_zone: Option<String>,
    seconds: f64,
}

/// `drove vdi handover NAME --to NODE`.
pub async fn handover(a: HandoverArgs, ctx: &Ctx) -> Result<()> {
    let timeout = crate::sync_cmd::parse_timeout(&a.timeout)?;
    let path = format!("/api/vdis/{}", encode(&a.name));
    let before: VdiDetail = ctx.get(&path).await?;
    let started = Instant::now();
    let d: VdiDetail = ctx
        .post(&format!("{path}/handover"), &Handover { to: NodeId(a.to) })
        .await?;
    let holder = d.lock.as_ref().map(|l| l.owner).filter(|o| o.0 != a.to);
    let mut released = holder.is_none();
    let mut now = d;
    if let (Some(owner), false) = (holder, a.no_wait) {
        if !ctx.json {
            eprintln!(
                "Asked node {owner} to flush{} and release VDI '{}' to node {}...",
                if before.info.policy == WritePolicy::ZoneSync {
                    ", ship its lag to the other zones"
                } else {
                    ""
                },
                a.name,
                a.to
            );
        }
        loop {
            now = ctx.get(&path).await?;
            if now.lock.as_ref().is_none_or(|l| l.owner != owner) {
                released = true;
                break;
            }
            if started.elapsed() >= timeout {
                bail!(
                    "Node {owner} did not release VDI '{}' within {timeout:?}: it may be \
                     draining a long lag (drove vdi info {} shows it) or be cut off; the \
                     request stands, and node {} takes the lock once it is released or \
                     its lease ends",
                    a.name,
                    a.name,
                    a.to
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let report = HandoverReport {
        vdi: a.name.clone(),
        to: a.to,
        released,
        home_zone_before: before.info.home_zone.clone(),
        home_zone: now.info.home_zone.clone(),
        seconds: started.elapsed().as_secs_f64(),
    };
    if ctx.json {
        return print_json(&report);
    }
    match holder {
        None => println!(
            "VDI '{}': nobody else writes it; node {} takes the lock at its first write",
            a.name, a.to
        ),
        Some(owner) if released => println!(
            "VDI '{}': node {owner} flushed and released it in {:.1} s; node {} takes the \
             lock at its first write",
            a.name, report.seconds, a.to
        ),
        Some(owner) => println!(
            "VDI '{}': asked node {owner} to hand it to node {} (not waited for)",
            a.name, a.to
        ),
    }
    if report.home_zone != report.home_zone_before {
        println!(
            "home zone:   {} -> {} (its objects move there in the background, at the \
             recovery rate; drove cluster status shows the progress)",
            report.home_zone_before.as_deref().unwrap_or("none"),
            report.home_zone.as_deref().unwrap_or("none")
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct PromoteArgs {
    /// VDI name.
    pub name: String,
    /// The zone that becomes the VDI's home (a node there may then write it).
    #[arg(long)]
    pub zone: String,
    /// Accept that a zone-sync VDI may lose the writes inside its lag (without it,
    /// promote says how much and changes nothing).
    #[arg(long)]
    pub yes: bool,
}

/// What may be missing after a promotion.
#[derive(Serialize)]
struct MayLose {
    /// Writes acknowledged within this long before the home zone was lost.
    ms: u64,
    /// At most this many bytes of them.
    bytes: u64,
}

/// What `drove vdi promote --json` prints.
#[derive(Serialize)]
struct PromoteReport {
    vdi: String,
    home_zone_before: Option<String>,
    home_zone: Option<String>,
    policy: WritePolicy,
    /// `null` for a sync VDI: no acknowledged write can be missing.
    may_lose: Option<MayLose>,
}

/// `drove vdi promote NAME --zone Z`.
pub async fn promote(a: PromoteArgs, ctx: &Ctx) -> Result<()> {
    let path = format!("/api/vdis/{}", encode(&a.name));
    let before: VdiDetail = ctx.get(&path).await?;
    let i = &before.info;
    let old = i.home_zone.as_deref().unwrap_or("none");
    let may_lose = (i.policy == WritePolicy::ZoneSync).then(|| {
        let (t, bytes) = i.max_lag();
        MayLose {
            ms: t.as_millis() as u64,
            bytes,
        }
    });
    let risk = match &may_lose {
        None => format!(
            "VDI '{}' is sync: every acknowledged write is on every copy, so none can be \
             missing after the promotion",
            a.name
        ),
        Some(m) => format!(
            "VDI '{}' is zone-sync: the copies outside its home zone {old} may miss the \
             writes acknowledged in the last {:.1} s before {old} was lost, at most {} bytes \
             (its --max-lag bounds)",
            a.name,
            m.ms as f64 / 1000.0,
            m.bytes
        ),
    };
    if may_lose.is_some() && !a.yes {
        bail!(
            "{risk}. Nothing was changed: run again with --yes to accept that and promote zone {}",
            a.zone
        );
    }
    let d: VdiDetail = ctx
        .post(
            &format!("{path}/promote"),
            &Promote {
                zone: a.zone.clone(),
            },
        )
        .await?;
    let report = PromoteReport {
        vdi: a.name.clone(),
        home_zone_before: before.info.home_zone.clone(),
        home_zone: d.info.home_zone.clone(),
        policy: d.info.policy,
        may_lose,
    };
    if ctx.json {
        return print_json(&report);
    }
    println!("{risk}.");
    println!(
        "home zone:   {old} -> {} (its objects get copies there in the background; a node \
         of {} may write it once the old writer's lease ends)",
        a.zone, a.zone
    );
    Ok(())
}
