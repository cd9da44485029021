//! Wire versions: the range of versions a node speaks, and the one a connection
//! uses, the highest both ends speak.
//!
//! Every frame's prefix carries its version ([`crate::frame`]). A connection opens
//! with a hello in version [`HELLO_VERSION`]'s frame and message layout, whatever
//! the two nodes speak: that layout is frozen, so that any two builds can at least
//! tell each other what they speak and why they refuse. In the hello each node
//! announces its range ([`crate::hello`]); every frame after it carries the chosen
//! version and is read only as that version.
//!
//! The versions:
//! - 1 to 3: before the hello; a version-1 node is answered in its own format
//!   ([`crate::legacy`]).
//! - 4: the hello names one version, the sender's only one.
//! - 5: the hello's payload carries the sender's range ([`WireRange::encode`]),
//!   and [`crate::PeerReq::MendRead`] is new (no release spoke a 5 without
//!   either). A connection of version 4 is never sent a request of a later
//!   version ([`crate::PeerReq::in_version`]: a mend read goes as the plain read
//!   version 4 knows), and refuses one ([`crate::PeerReq::since`]).
//!
//! A build speaks [`WireRange::BUILD`]. Tests make a node speak a narrower range
//! (an older node, or one that has dropped an old version) with the environment
//! variable [`TEST_RANGE_ENV`], which is for tests only.
use serde::{Deserialize, Serialize};

/// The version of the hello's frame and message layout, for every build to come.
pub const HELLO_VERSION: u8 = 4;

/// The oldest version a node speaks whose hello says nothing of a range: its
/// range is its hello's version alone.
const FIRST_RANGED: u8 = 5;

/// Test-only: a node started with `DROVE_TEST_WIRE_RANGE=A-B` (or `=A`) speaks
/// versions A to B, which must lie within what the build speaks. Read once when
/// the node starts.
pub const TEST_RANGE_ENV: &str = "DROVE_TEST_WIRE_RANGE";

/// The wire versions a node speaks, `min` to `max` inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireRange {
    /// The oldest.
    pub min: u8,
    /// The newest.
    pub max: u8,
}

impl std::fmt::Display for WireRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

impl WireRange {
    /// What this build speaks.
    pub const BUILD: WireRange = WireRange { min: 4, max: 5 };

    /// Just `v`.
    pub const fn only(v: u8) -> WireRange {
        WireRange { min: v, max: v }
    }

    /// Whether `v` is in the range.
    pub fn contains(&self, v: u8) -> bool {
        (self.min..=self.max).contains(&v)
    }

    /// The highest version both ranges hold, if they overlap.
    pub fn common(&self, other: &WireRange) -> Option<u8> {
        let high = self.max.min(other.max);
        (high >= self.min.max(other.min)).then_some(high)
    }

    /// Whether a hello from a node of this range carries the range (version 5 on).
    pub fn announced(&self) -> bool {
        self.max >= FIRST_RANGED
    }

    /// The range as a hello's payload (empty for a node that speaks only
    /// versions before 5, as such a node sent).
    pub fn encode(&self) -> Vec<u8> {
        if !self.announced() {
            return Vec::new();
        }
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// The range a hello's payload announces; `None` for an empty payload (a node
    /// of version 4, whose range is its hello's version alone). Bytes after the
    /// range are ignored (room for later versions); an empty range, or one a node
    /// of version 5 or later could not have sent, is refused.
    pub fn decode(payload: &[u8]) -> Result<Option<WireRange>, String> {
        if payload.is_empty() {
            return Ok(None);
        }
        let (r, _rest) = postcard::take_from_bytes::<WireRange>(payload)
            .map_err(|_| "announced a wire range that does not decode".to_string())?;
        if r.min > r.max || !r.announced() {
            return Err(format!("announced wire versions {}-{}", r.min, r.max));
        }
        Ok(Some(r))
    }

    /// Parse `A-B` or `A`; it must lie within `within`.
    pub fn parse_within(s: &str, within: WireRange) -> Result<WireRange, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<u8>()
                .map_err(|_| format!("{TEST_RANGE_ENV}={s}: not a version range like 4-5"))
        };
        let r = match s.split_once('-') {
            Some((a, b)) => WireRange {
                min: num(a)?,
                max: num(b)?,
            },
            None => WireRange::only(num(s)?),
        };
        if r.min > r.max || r.min < within.min || r.max > within.max {
            return Err(format!(
                "{TEST_RANGE_ENV}={s}: this build speaks drove wire versions {within}"
            ));
        }
        Ok(r)
    }

    /// What a node speaks: [`WireRange::BUILD`], narrowed by [`TEST_RANGE_ENV`]
    /// when set. Called once at startup.
    pub fn for_node() -> Result<WireRange, String> {
        match std::env::var(TEST_RANGE_ENV) {
            Ok(s) => WireRange::parse_within(&s, WireRange::BUILD),
            Err(std::env::VarError::NotPresent) => Ok(WireRange::BUILD),
            Err(_) => Err(format!("{TEST_RANGE_ENV} is not UTF-8")),
        }
    }
}

#[cfg(test)]
#[path = "version_tests.rs"]
mod tests;
