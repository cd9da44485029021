//! What the state machine remembers of a recent request ([`Remembered`]): its id, its
//! result, and a digest of its command ([`digest`]), so that the same id sent again
//! with the same command (a retry whose answer was lost) gets the first result, and
//! the same id with another command (a user reusing `--request-id`) is refused
//! instead of answering for a command it is not.
//!
//! The digest leaves out what a proposer stamps on its own command (its clock, its
//! node id): a retry sent a second later, or through another node, is the same
//! command. It is computed in the state machine from the log entry, so every replica
//! computes the same one; it is part of the snapshot, and so an on-disk format: its
//! bytes are the postcard encoding of the command (fields in declaration order, no
//! maps with a per-process order) hashed with FNV-1a. 64 bits tell a mistake apart
//! from a retry; they are no defence against a client that means harm, which needs
//! the admin role to send commands at all.
use crate::state::{ApplyResult, Command};
use crate::types::RequestId;
use serde::{Deserialize, Serialize, Serializer};

/// One remembered request. Written as a JSON array `[id, result, digest]`, as the
/// pair `[id, result]` of snapshots from before digests were kept (those read with
/// no digest, and are answered without a comparison).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Remembered {
    /// The request id.
    pub(crate) id: RequestId,
    /// What applying it returned.
    pub(crate) result: ApplyResult,
    /// [`digest`] of its command; `None` in snapshots from before it was kept.
    #[serde(default)]
    pub(crate) digest: Option<u64>,
}

impl Serialize for Remembered {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.id, &self.result, &self.digest).serialize(s)
    }
}

impl Remembered {
    /// The answer to `id` sent again with a command of digest `digest`: the first
    /// result when the command is the same, a refusal when it is not.
    pub(crate) fn answer(&self, digest: u64) -> ApplyResult {
        match self.digest {
            Some(d) if d != digest => Err((
                drove_types::ErrorKind::Invalid,
                "This request id was used before for another command: a request id \
                 names one change (sent again, it answers with that change's first \
                 outcome), so this command was not run. Run it with a new request id \
                 (without --request-id, the CLI picks one)"
                    .to_string(),
            )),
            _ => self.result.clone(),
        }
    }
}

/// The digest of `cmd` as a retry of it would also have it: the proposer's clock
/// and node id zeroed.
pub(crate) fn digest(cmd: &Command) -> u64 {
    let mut c = cmd.clone();
    match &mut c {
        Command::CreateVdi { now, .. } => *now = 0,
        Command::SnapshotVdi { by, now_ms, .. } => {
            *by = drove_types::NodeId(0);
            *now_ms = 0;
        }
        Command::RollbackVdi { now_ms, .. } | Command::AcquireLock { now_ms, .. } => *now_ms = 0,
        _ => {}
    }
    // Encoding into a Vec fails only for types postcard cannot encode, which no
    // command holds; such a command would get the digest of no bytes.
    let bytes = postcard::to_allocvec(&c).unwrap_or_default();
    fnv1a(&bytes)
}

/// FNV-1a, 64 bits: fixed by its definition, the same on every build and platform.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fnv1a_gives_the_published_values() {
        // From the FNV reference test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn test_the_digest_leaves_out_the_proposers_clock_and_id_only() {
        let snap = |snap: &str, by, now_ms| Command::SnapshotVdi {
            name: "v".into(),
            snap: snap.into(),
            by: drove_types::NodeId(by),
            now_ms,
        };
        assert_eq!(digest(&snap("s", 1, 10)), digest(&snap("s", 2, 20)));
        assert_ne!(digest(&snap("s", 1, 10)), digest(&snap("t", 1, 10)));
        assert_ne!(
            digest(&Command::SetNoout(true)),
            digest(&Command::SetNoout(false))
        );
    }

    #[test]
    fn test_a_remembered_pair_from_an_old_snapshot_reads_without_a_digest() {
        let old = r#"[{"client":1,"seq":2},{"Ok":"Done"}]"#;
        let r: Remembered = serde_json::from_str(old).unwrap();
        assert_eq!(r.digest, None);
        assert_eq!(r.answer(5), Ok(crate::state::Reply::Done));
        let new = Remembered {
            digest: Some(7),
            ..r
        };
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(text, r#"[{"client":1,"seq":2},{"Ok":"Done"},7]"#);
        let back: Remembered = serde_json::from_str(&text).unwrap();
        assert_eq!(back.answer(7), Ok(crate::state::Reply::Done));
        assert!(back.answer(8).is_err());
    }
}
