//! A VDI's quality of service: limits on the I/O its clients may do, per second,
//! enforced by token buckets where the clients attach (the gateway node's
//! frontends). `None` is no limit. Kept in the VDI's record in the metadata, so a
//! limit holds wherever the VDI is attached next (a hand-over, a migration).
//!
//! The same type carries a change (`drove vdi set`): there `None` leaves a limit
//! as it is and `Some(0)` lifts it.
use serde::{Deserialize, Serialize};

use crate::{format_size, Error, Result};

/// Lowest IOPS limit.
pub const MIN_IOPS: u64 = 1;
/// Highest IOPS limit.
pub const MAX_IOPS: u64 = 10_000_000;
/// Lowest bytes/s limit: 4 KiB/s.
pub const MIN_BPS: u64 = 4096;
/// Highest bytes/s limit: 1 TiB/s.
pub const MAX_BPS: u64 = 1 << 40;
/// The burst when none is set: 1 s of the limit may be spent at once after a quiet
/// spell.
pub const DEFAULT_BURST_MS: u32 = 1000;
/// Shortest burst.
pub const MIN_BURST_MS: u32 = 100;
/// Longest burst.
pub const MAX_BURST_MS: u32 = 60_000;

/// Per-second limits on a VDI's I/O, and how much of them may be spent at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    /// Read requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    /// Write requests per second (writes, zeroes and trims).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    /// Bytes read per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bps: Option<u64>,
    /// Bytes written per second (zeroes and trims carry no data and count none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bps: Option<u64>,
    /// How much may be spent at once after a quiet spell: this many milliseconds'
    /// worth of each limit; `None` is [`DEFAULT_BURST_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u32>,
}

impl Qos {
    /// No limit at all (the default; not written out in the VDI's record).
    pub fn is_unlimited(&self) -> bool {
        self.read_iops.is_none()
            && self.write_iops.is_none()
            && self.read_bps.is_none()
            && self.write_bps.is_none()
    }

    /// Whether this, as a change, changes nothing.
    pub fn is_empty_change(&self) -> bool {
        self.is_unlimited() && self.burst_ms.is_none()
    }

    /// The burst, in milliseconds.
    pub fn burst_ms(&self) -> u32 {
        self.burst_ms.unwrap_or(DEFAULT_BURST_MS)
    }

    /// These limits with `change` applied: a value set there replaces this one, `0`
    /// lifts it (a burst of 0 goes back to the default).
    pub fn merged(&self, change: &Qos) -> Qos {
        let pick = |old: Option<u64>, new: Option<u64>| match new {
            Some(0) => None,
            Some(v) => Some(v),
            None => old,
        };
        Qos {
            read_iops: pick(self.read_iops, change.read_iops),
            write_iops: pick(self.write_iops, change.write_iops),
            read_bps: pick(self.read_bps, change.read_bps),
            write_bps: pick(self.write_bps, change.write_bps),
            burst_ms: match change.burst_ms {
                Some(0) => None,
                Some(v) => Some(v),
                None => self.burst_ms,
            },
        }
    }

    /// Check every limit is within its bounds (a change's `0`s are taken). A
    /// message naming the limit otherwise.
    pub fn validate(&self, change: bool) -> Result<()> {
        let lifted = |v: Option<u64>| change && v == Some(0);
        for (what, v) in [
            ("read IOPS", self.read_iops),
            ("write IOPS", self.write_iops),
        ] {
            if let Some(n) = v.filter(|_| !lifted(v)) {
                if !(MIN_IOPS..=MAX_IOPS).contains(&n) {
                    return Err(Error::invalid(format!(
                        "Bad {what} limit {n}: use {MIN_IOPS} to {MAX_IOPS}{}",
                        if change { " (0 lifts it)" } else { "" }
                    )));
                }
            }
        }
        for (what, v) in [("read", self.read_bps), ("write", self.write_bps)] {
            if let Some(n) = v.filter(|_| !lifted(v)) {
                if !(MIN_BPS..=MAX_BPS).contains(&n) {
                    return Err(Error::invalid(format!(
                        "Bad {what} bytes/s limit {n}: use {} to {} per second{}",
                        format_size(MIN_BPS),
                        format_size(MAX_BPS),
                        if change { " (0 lifts it)" } else { "" }
                    )));
                }
            }
        }
        if let Some(b) = self.burst_ms.filter(|&b| !(change && b == 0)) {
            if !(MIN_BURST_MS..=MAX_BURST_MS).contains(&b) {
                return Err(Error::invalid(format!(
                    "Bad burst {b} ms: use {MIN_BURST_MS} ms to {} s",
                    MAX_BURST_MS / 1000
                )));
            }
        }
        Ok(())
    }

    /// `unlimited`, or e.g. `read 500 IOPS, 100M/s; write 200 IOPS; burst 1 s`.
    pub fn describe(&self) -> String {
        if self.is_unlimited() {
            return "unlimited".to_string();
        }
        let side = |what: &str, iops: Option<u64>, bps: Option<u64>| {
            let mut parts = Vec::new();
            if let Some(n) = iops {
                parts.push(format!("{n} IOPS"));
            }
            if let Some(b) = bps {
                parts.push(format!("{}/s", format_size(b)));
            }
            (!parts.is_empty()).then(|| format!("{what} {}", parts.join(", ")))
        };
        let mut out: Vec<String> = [
            side("read", self.read_iops, self.read_bps),
            side("write", self.write_iops, self.write_bps),
        ]
        .into_iter()
        .flatten()
        .collect();
        let b = self.burst_ms();
        out.push(if b.is_multiple_of(1000) {
            format!("burst {} s", b / 1000)
        } else {
            format!("burst {b} ms")
        });
        out.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_change_sets_replaces_and_lifts_limits() {
        let q = Qos {
            read_iops: Some(100),
            write_bps: Some(1 << 20),
            ..Qos::default()
        };
        let c = Qos {
            read_iops: Some(0),
            write_iops: Some(50),
            burst_ms: Some(2000),
            ..Qos::default()
        };
        let m = q.merged(&c);
        assert_eq!(m.read_iops, None, "0 lifts");
        assert_eq!(m.write_iops, Some(50), "set");
        assert_eq!(m.write_bps, Some(1 << 20), "kept");
        assert_eq!(m.burst_ms(), 2000);
        assert_eq!(m.merged(&Qos::default()), m, "an empty change keeps all");
        let back = m.merged(&Qos {
            burst_ms: Some(0),
            ..Qos::default()
        });
        assert_eq!(back.burst_ms(), DEFAULT_BURST_MS);
    }

    #[test]
    fn test_limits_out_of_bounds_are_refused_with_their_name() {
        for (q, want) in [
            (
                Qos {
                    read_iops: Some(MAX_IOPS + 1),
                    ..Qos::default()
                },
                "read IOPS",
            ),
            (
                Qos {
                    write_bps: Some(100),
                    ..Qos::default()
                },
                "write bytes/s",
            ),
            (
                Qos {
                    burst_ms: Some(10),
                    ..Qos::default()
                },
                "burst",
            ),
        ] {
            let e = q.validate(false).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
        let zero = Qos {
            write_iops: Some(0),
            ..Qos::default()
        };
        assert!(zero.validate(false).is_err(), "a stored 0 is no limit");
        assert!(zero.validate(true).is_ok(), "a change's 0 lifts");
    }

    #[test]
    fn test_description() {
        assert_eq!(Qos::default().describe(), "unlimited");
        let q = Qos {
            read_iops: Some(500),
            read_bps: Some(100 << 20),
            write_iops: Some(200),
            ..Qos::default()
        };
        assert_eq!(
            q.describe(),
            "read 500 IOPS, 100M/s; write 200 IOPS; burst 1 s"
        );
    }
}
