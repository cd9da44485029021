//! A VDI's write policy: the flags `vdi create` and `vdi set` share, `vdi set`
//! itself, and the policy line `vdi info` prints. Values are parsed and checked here,
//! before any request, so a bad one is one clear line; the node checks them again.
use anyhow::Result;
use clap::Args;
use drove_daemon::api::{Policy, VdiDetail};
use drove_paperbench::config::parse_duration_ms;
use drove_types::{format_size, parse_size, validate_max_lag, VdiInfo, WritePolicy};

use crate::client::{print_json, Ctx};
use crate::vdi_cmd::encode;

#[derive(Args, Default)]
pub struct PolicyArgs {
    /// When a write is acknowledged. `sync`: once every copy has it. `zone-sync`:
    /// once the copies in the VDI's home zone have it; the copies in other zones
    /// follow within the lag bound (--max-lag, --max-lag-bytes), and writers are
    /// slowed when it is reached. `drove vdi sync NAME` waits until they have caught
    /// up. A VDI without a home zone yet writes as sync. Default: sync.
    #[arg(long, value_name = "sync|zone-sync")]
    pub policy: Option<String>,
    /// Zone-sync: how far, in time, the other zones' copies may fall behind, e.g.
    /// 500ms, 5s or 2m (1ms to 10m; default 5s; `default` puts it back).
    #[arg(long, value_name = "DURATION")]
    pub max_lag: Option<String>,
    /// Zone-sync: how many written bytes the other zones' copies may lack, e.g.
    /// 64M or 1G (1M to 16G; default 256M; `default` puts it back). Held in the
    /// writer's memory.
    #[arg(long, value_name = "SIZE")]
    pub max_lag_bytes: Option<String>,
}

impl PolicyArgs {
    /// The flags as an API request body, checked.
    pub fn parse(&self) -> Result<Policy> {
        let policy = match &self.policy {
            Some(p) => Some(p.parse::<WritePolicy>()?.to_string()),
            None => None,
        };
        let is_default = |s: &Option<String>| s.as_deref().map(str::trim) == Some("default");
        let (reset_max_lag_ms, reset_max_lag_bytes) =
            (is_default(&self.max_lag), is_default(&self.max_lag_bytes));
        let max_lag_ms = match &self.max_lag {
            Some(s) if !reset_max_lag_ms => Some(parse_lag(s)?),
            _ => None,
        };
        let max_lag_bytes = match &self.max_lag_bytes {
            Some(s) if !reset_max_lag_bytes => {
                let b = parse_size(s)?;
                validate_max_lag(None, Some(b))?;
                Some(b)
            }
            _ => None,
        };
        Ok(Policy {
            policy,
            max_lag_ms,
            max_lag_bytes,
            reset_max_lag_ms,
            reset_max_lag_bytes,
        })
    }
}

/// A lag bound in time: a number with a unit (a bare number could mean ms or s).
fn parse_lag(s: &str) -> Result<u32> {
    if s.trim().chars().all(|c| c.is_ascii_digit()) {
        return Err(crate::fail::invalid(format!(
            "Bad --max-lag '{s}': give a unit, e.g. 500ms, 5s or 2m"
        )));
    }
    let Ok(ms) = u32::try_from(parse_duration_ms(s, 1)?) else {
        return Err(crate::fail::invalid(format!(
            "Bad --max-lag '{s}': use 1ms to 10m"
        )));
    };
    validate_max_lag(Some(ms), None)?;
    Ok(ms)
}

#[derive(Args)]
pub struct SetArgs {
    /// VDI name.
    pub name: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub qos: crate::qos_cmd::QosArgs,
}

/// `drove vdi set NAME [--policy P] [--max-lag D] [--max-lag-bytes S]
/// [--iops-limit N ...]`: the write policy, then the I/O limits.
pub async fn set(a: SetArgs, ctx: &Ctx) -> Result<()> {
    let body = a.policy.parse()?;
    let qos = a.qos.parse()?;
    let policy_change = body.policy.is_some()
        || body.max_lag_ms.is_some()
        || body.max_lag_bytes.is_some()
        || body.reset_max_lag_ms
        || body.reset_max_lag_bytes;
    if !policy_change && qos.is_empty_change() {
        return Err(crate::fail::invalid(
            "Nothing to change: give --policy, --max-lag, --max-lag-bytes or an I/O limit \
             (--iops-limit, --bps-limit, their --read-/--write- forms, --burst)",
        ));
    }
    let mut d: Option<VdiDetail> = None;
    if policy_change {
        let path = format!("/api/vdis/{}/policy", encode(&a.name));
        d = Some(ctx.post(&path, &body).await?);
    }
    if !qos.is_empty_change() {
        let path = format!("/api/vdis/{}/qos", encode(&a.name));
        d = Some(ctx.post(&path, &qos).await?);
    }
    let Some(d) = d else {
        return Ok(());
    };
    if ctx.json {
        return print_json(&d);
    }
    if policy_change {
        println!("VDI '{}': policy {}", d.info.name, describe(&d.info));
    }
    if !qos.is_empty_change() {
        println!(
            "VDI '{}': I/O limits {}",
            d.info.name,
            d.info.qos.describe()
        );
    }
    Ok(())
}

/// `sync`, or `zone-sync (max lag 5 s, 256 MiB)`.
pub fn describe(i: &VdiInfo) -> String {
    match i.policy {
        WritePolicy::Sync => "sync".to_string(),
        WritePolicy::ZoneSync => {
            let (time, bytes) = i.max_lag();
            let home = if i.home_zone.is_none() {
                "; writes as sync until it has a home zone"
            } else {
                ""
            };
            format!(
                "zone-sync (max lag {}, {}{home})",
                human_ms(time.as_millis()),
                human_bytes(bytes)
            )
        }
    }
}

fn human_ms(ms: u128) -> String {
    if ms > 0 && ms.is_multiple_of(60_000) {
        format!("{} min", ms / 60_000)
    } else if ms >= 1000 && ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// `256 MiB`, `1.5 GiB`: [`format_size`] with spelled-out units.
fn human_bytes(b: u64) -> String {
    let s = format_size(b);
    match s.char_indices().last() {
        Some((at, unit @ ('K' | 'M' | 'G' | 'T'))) => format!("{} {unit}iB", &s[..at]),
        _ => format!("{s} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(policy: Option<&str>, lag: Option<&str>, bytes: Option<&str>) -> PolicyArgs {
        PolicyArgs {
            policy: policy.map(str::to_string),
            max_lag: lag.map(str::to_string),
            max_lag_bytes: bytes.map(str::to_string),
        }
    }

    #[test]
    fn test_policy_flags_parse_and_refuse_bad_values() {
        let p = args(Some("zone-sync"), Some("2s"), Some("64MiB"))
            .parse()
            .unwrap();
        assert_eq!(p.policy.as_deref(), Some("zone-sync"));
        assert_eq!(p.max_lag_ms, Some(2000));
        assert_eq!(p.max_lag_bytes, Some(64 << 20));
        assert_eq!(
            args(None, Some("500ms"), None).parse().unwrap().max_lag_ms,
            Some(500)
        );
        assert_eq!(
            args(None, Some("2m"), None).parse().unwrap().max_lag_ms,
            Some(120_000)
        );
        let p = args(None, Some("default"), Some("default"))
            .parse()
            .unwrap();
        assert_eq!((p.max_lag_ms, p.max_lag_bytes), (None, None));
        assert!(p.reset_max_lag_ms && p.reset_max_lag_bytes);
        let p = args(None, None, Some("1G")).parse().unwrap();
        assert!(!p.reset_max_lag_ms && !p.reset_max_lag_bytes);
        for (a, words) in [
            (
                args(Some("fast"), None, None),
                "Unknown write policy 'fast'",
            ),
            (args(None, Some("5"), None), "give a unit"),
            (args(None, Some("0ms"), None), "Bad lag bound"),
            (args(None, Some("11m"), None), "Bad lag bound"),
            (args(None, Some("5000000m"), None), "Bad --max-lag"),
            (args(None, Some("5h"), None), "Bad duration unit"),
            (args(None, None, Some("4K")), "Bad lag bound"),
            (args(None, None, Some("lots")), "Bad size"),
        ] {
            let e = format!("{:#}", a.parse().unwrap_err());
            assert!(e.contains(words), "{e}");
        }
    }

    #[test]
    fn test_describe_names_the_bounds() {
        let mut i = VdiInfo {
            home_zone: Some("z1".into()),
            ..VdiInfo::new(drove_types::VdiId(1), "v", 1 << 30, 4 << 20, 3)
        };
        assert_eq!(describe(&i), "sync");
        i.policy = WritePolicy::ZoneSync;
        assert_eq!(describe(&i), "zone-sync (max lag 5 s, 256 MiB)");
        i.max_lag_ms = Some(1500);
        i.max_lag_bytes = Some(3 << 29);
        assert_eq!(describe(&i), "zone-sync (max lag 1500 ms, 1.5 GiB)");
        i.max_lag_ms = Some(120_000);
        i.home_zone = None;
        assert_eq!(
            describe(&i),
            "zone-sync (max lag 2 min, 1.5 GiB; writes as sync until it has a home zone)"
        );
    }
}
