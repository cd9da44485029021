//! A VDI's I/O limits on the command line: the flags `vdi create` and `vdi set`
//! share, parsed and checked before any request so a bad one is one clear line
//! (the node checks them again).
use anyhow::Result;
use clap::Args;
use drove_types::{parse_size, Qos};

#[derive(Args, Default, Debug)]
pub struct QosArgs {
    /// Limit of requests per second, reads and writes each (e.g. 500; 0 lifts
    /// it). Attached clients are held to a change within a second. The limits hold
    /// on every node the VDI is attached through, one node at a time.
    #[arg(long, value_name = "N")]
    pub iops_limit: Option<u64>,
    /// Limit of read requests per second (0 lifts it).
    #[arg(long, value_name = "N")]
    pub read_iops_limit: Option<u64>,
    /// Limit of write requests per second; zeroes and trims count (0 lifts it).
    #[arg(long, value_name = "N")]
    pub write_iops_limit: Option<u64>,
    /// Limit of bytes per second, reads and writes each, e.g. 100M (4K to 1T;
    /// 0 lifts it).
    #[arg(long, value_name = "SIZE")]
    pub bps_limit: Option<String>,
    /// Limit of bytes read per second (0 lifts it).
    #[arg(long, value_name = "SIZE")]
    pub read_bps_limit: Option<String>,
    /// Limit of bytes written per second; zeroes and trims carry none (0 lifts it).
    #[arg(long, value_name = "SIZE")]
    pub write_bps_limit: Option<String>,
    /// How much of each limit a quiet VDI may spend at once, in time at the limit:
    /// 100ms to 60s (default 1s; 0 puts the default back).
    #[arg(long, value_name = "DURATION")]
    pub burst: Option<String>,
}

impl QosArgs {
    /// The flags as a change of a VDI's limits (a limit of 0 lifts it), checked.
    pub fn parse(&self) -> Result<Qos> {
        let size = |flag: &str, s: &Option<String>| -> Result<Option<u64>> {
            match s.as_deref().map(str::trim) {
                None => Ok(None),
                Some("0") => Ok(Some(0)),
                Some(v) => parse_size(v)
                    .map(Some)
                    .map_err(|e| crate::fail::invalid(format!("Bad --{flag} '{v}': {e}"))),
            }
        };
        let both = |one: Option<u64>, all: Option<u64>| one.or(all);
        let bps = size("bps-limit", &self.bps_limit)?;
        let burst_ms = match self.burst.as_deref().map(str::trim) {
            None => None,
            Some("0") => Some(0),
            Some(s) => {
                let ms = drove_paperbench::config::parse_duration_ms(s, 1)
                    .map_err(|e| crate::fail::invalid(format!("Bad --burst '{s}': {e}")))?;
                Some(u32::try_from(ms).map_err(|_| {
                    crate::fail::invalid(format!("Bad --burst '{s}': use 100ms to 60s"))
                })?)
            }
        };
        let q = Qos {
            read_iops: both(self.read_iops_limit, self.iops_limit),
            write_iops: both(self.write_iops_limit, self.iops_limit),
            read_bps: both(size("read-bps-limit", &self.read_bps_limit)?, bps),
            write_bps: both(size("write-bps-limit", &self.write_bps_limit)?, bps),
            burst_ms,
        };
        q.validate(true)?;
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_flags_make_a_change_and_bad_ones_are_refused() {
        let a = QosArgs {
            iops_limit: Some(500),
            write_iops_limit: Some(200),
            bps_limit: Some("100M".into()),
            burst: Some("2s".into()),
            ..QosArgs::default()
        };
        let q = a.parse().unwrap();
        assert_eq!(q.read_iops, Some(500));
        assert_eq!(q.write_iops, Some(200), "the narrower flag wins");
        assert_eq!(q.read_bps, Some(100 << 20));
        assert_eq!(q.write_bps, Some(100 << 20));
        assert_eq!(q.burst_ms, Some(2000));
        let lift = QosArgs {
            iops_limit: Some(0),
            ..QosArgs::default()
        };
        assert_eq!(lift.parse().unwrap().read_iops, Some(0));
        for (bad, want) in [
            (
                QosArgs {
                    bps_limit: Some("lots".into()),
                    ..QosArgs::default()
                },
                "--bps-limit",
            ),
            (
                QosArgs {
                    write_bps_limit: Some("1K".into()),
                    ..QosArgs::default()
                },
                "write bytes/s",
            ),
            (
                QosArgs {
                    burst: Some("5m".into()),
                    ..QosArgs::default()
                },
                "burst",
            ),
        ] {
            let e = bad.parse().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
