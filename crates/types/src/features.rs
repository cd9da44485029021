//! Cluster feature levels: what every member of a cluster can read.
//!
//! Every node reads every metadata command in the Raft log and every peer message its
//! wire version allows. A build that adds a command, or a field whose meaning an
//! older build would silently drop, gives it a feature level: the cluster uses it
//! only once its level ([`FeatureLevel`] in the metadata settings) is that high, and
//! the level rises only when the operator runs `drove cluster upgrade finish`, which
//! is refused while any member runs a build that does not know the level (Ceph's
//! `require-osd-release`). A node whose build knows less than the cluster's level is
//! refused when it joins or records itself, naming both levels.
//!
//! The levels:
//! - 1: everything up to the release before levels existed (5def163; wire version 4).
//! - 2: per-VDI I/O limits (`SetVdiQos`, `SetDefaultQos`, `CreateVdi` with limits),
//!   and `FinishUpgrade` itself.
//! - 3: a gateway's verdict that a node is down carries who judged it and on which
//!   map (`SetNodeState`'s `judged`), and is refused when its judge has been down
//!   since (an older build would apply it: the two state machines would differ).
//! - 4: such a verdict on a node of another zone is refused too when another node
//!   of the judge's zone was marked down since its map (the judge was likely cut
//!   off with its zone).

/// The newest cluster feature level this build knows.
pub const FEATURE_LEVEL: u32 = 4;

/// The level of a node or cluster that says nothing of levels (a build from
/// before them).
pub const BASE_FEATURE_LEVEL: u32 = 1;

/// What level `level` brought, for messages.
pub fn feature_name(level: u32) -> &'static str {
    match level {
        0 | 1 => "the base features",
        2 => "per-VDI I/O limits",
        3 => "verdicts checked against their judge's view",
        4 => "verdicts checked against their judge's zone",
        _ => "features of a newer build",
    }
}

/// Test-only: a node started with `DROVE_TEST_FEATURE_LEVEL=N` says its build knows
/// level N only (1 to [`FEATURE_LEVEL`]), as a node of an older build would; read
/// once when the node starts. It changes what the node says of itself, not what
/// it can read.
pub const TEST_LEVEL_ENV: &str = "DROVE_TEST_FEATURE_LEVEL";

/// The level a node says its build knows: [`FEATURE_LEVEL`], or the test hook's.
pub fn level_for_node() -> Result<u32, String> {
    match std::env::var(TEST_LEVEL_ENV) {
        Ok(s) => match s.trim().parse::<u32>() {
            Ok(n) if (BASE_FEATURE_LEVEL..=FEATURE_LEVEL).contains(&n) => Ok(n),
            _ => Err(format!(
                "{TEST_LEVEL_ENV}={s}: this build knows feature levels {BASE_FEATURE_LEVEL} to \
                 {FEATURE_LEVEL}"
            )),
        },
        Err(std::env::VarError::NotPresent) => Ok(FEATURE_LEVEL),
        Err(_) => Err(format!("{TEST_LEVEL_ENV} is not UTF-8")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_level_has_a_name_and_the_newest_is_not_a_newer_builds() {
        for l in BASE_FEATURE_LEVEL..=FEATURE_LEVEL {
            assert_ne!(feature_name(l), feature_name(FEATURE_LEVEL + 1), "{l}");
        }
    }
}
