//! `drove vdi sync` and the zone-sync lag `vdi info` shows: both asked of the node
//! writing the VDI, through any node (`/api/vdis/NAME/sync`, `/lag`).
use anyhow::Result;
use clap::Args;
use drove_daemon::wan::{LagReport, SyncReport, SyncRequest};
use drove_paperbench::config::parse_duration_ms;
use std::time::Duration;

use crate::client::{print_json, Ctx};
use crate::vdi_cmd::encode;

#[derive(Args)]
pub struct SyncArgs {
    /// VDI name.
    pub name: String,
    /// Give up after this long, e.g. 30s or 10m (at most 60m).
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub timeout: String,
}

/// `drove vdi sync NAME`: wait until the copies outside the VDI's home zone have
/// every write acknowledged so far, durably.
pub async fn sync(a: SyncArgs, ctx: &Ctx) -> Result<()> {
    let secs = parse_timeout(&a.timeout)?.as_millis().div_ceil(1000) as u64;
    let body = SyncRequest {
        timeout_s: Some(secs),
    };
    let path = format!("/api/vdis/{}/sync", encode(&a.name));
    let r: SyncReport = ctx
        .post_long(&path, &body, Duration::from_secs(secs + 10))
        .await?;
    if ctx.json {
        return print_json(&r);
    }
    match r.holder {
        None => println!(
            "VDI '{}': nobody writes it, so every copy has every write",
            r.vdi
        ),
        Some(n) => {
            println!(
                "VDI '{}': the copies outside its home zone have every write acknowledged \
                 before the sync, durably (writer node {n}, {:.1} s)",
                r.vdi, r.seconds
            );
            if r.lag_after.writes > 0 {
                println!("since then:  {}", describe(&r.lag_after));
            }
        }
    }
    Ok(())
}

/// A `--timeout` of a command that waits (`vdi sync`, `vdi handover`): 1 ms to 60 minutes (units ms, s, m).
pub fn parse_timeout(s: &str) -> Result<Duration> {
    let ms = parse_duration_ms(s, 1)?;
    if !(1..=3_600_000).contains(&ms) {
        return Err(crate::fail::invalid(format!(
            "Bad --timeout '{s}': use 1ms to 60m (units ms, s, m)"
        )));
    }
    Ok(Duration::from_millis(ms))
}

/// The lag of VDI `name` at its writer.
pub async fn lag(ctx: &Ctx, name: &str) -> Result<LagReport> {
    ctx.get(&format!("/api/vdis/{}/lag", encode(name))).await
}

/// `12.0 MiB in 30 writes, the oldest 0.8 s old`, or `none`.
pub fn describe(l: &LagReport) -> String {
    if l.writes == 0 {
        return "none (the other zones' copies have every write)".to_string();
    }
    format!(
        "{} bytes in {} writes, the oldest {:.1} s old",
        l.bytes, l.writes, l.seconds
    )
}

/// The lag line of `vdi info`: the lag, or why it is not known.
pub fn lag_line(lag: &Result<LagReport>) -> String {
    match lag {
        Ok(l) => describe(l),
        Err(e) => format!("unknown ({e:#})"),
    }
}
