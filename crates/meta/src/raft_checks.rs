//! Bounds every Raft RPC must keep before openraft sees it. openraft trusts its
//! peers: one forged vote with term u64::MAX (and a log index of 2^63) made the
//! leader panic, and the poisoned term, persisted by every node that saw it, kept
//! the metadata cluster from ever starting again. The cluster id (checked before
//! this) stops strangers from other clusters; these bounds stop values no real
//! member can produce from reaching persistent state, whoever sends them.
//!
//! The bounds leave every legitimate message through. They cannot look at
//! membership: a node that was away may hold a stale membership, and refusing the
//! current leader's appends would leave it behind for good. Terms: a candidate
//! raises its term by one per election timeout (250-350 ms), so even a node cut off
//! for 30 years stays within [`MAX_TERM_STEP`] of the others. Indexes: one entry per
//! metadata command; 2^48 of them is millennia of commands at any rate drove
//! reaches.
use crate::types::TypeConfig;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{LogId, Vote};

/// How far above this node's term a message's term may be.
pub const MAX_TERM_STEP: u64 = 1 << 32;

/// Largest term or log index any message may carry.
pub const MAX_TERM_OR_INDEX: u64 = 1 << 48;

/// Most entries one append may carry (openraft sends at most 300 by default).
pub const MAX_ENTRIES: usize = 4096;

/// Largest offset of a snapshot chunk.
pub const MAX_SNAPSHOT_OFFSET: u64 = 1 << 40;

/// What this node knows that a message is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Own {
    /// This node's current term.
    pub term: u64,
}

fn check_vote(v: &Vote<u64>, own: Own) -> Result<(), String> {
    let term = v.leader_id.term;
    if term > MAX_TERM_OR_INDEX || term > own.term.saturating_add(MAX_TERM_STEP) {
        return Err(format!(
            "term {term} is out of reach from this node's term {}",
            own.term
        ));
    }
    Ok(())
}

fn check_log_id(what: &str, id: &Option<LogId<u64>>, vote_term: u64) -> Result<(), String> {
    let Some(id) = id else {
        return Ok(());
    };
    if id.index > MAX_TERM_OR_INDEX {
        return Err(format!("{what} index {} is out of range", id.index));
    }
    if id.leader_id.term > vote_term {
        return Err(format!(
            "{what} term {} is above the sender's term {vote_term}",
            id.leader_id.term
        ));
    }
    Ok(())
}

/// Check a vote request.
pub fn vote(req: &VoteRequest<u64>, own: Own) -> Result<(), String> {
    check_vote(&req.vote, own)?;
    check_log_id("last log id", &req.last_log_id, req.vote.leader_id.term)
}

/// Check an append request: bounded terms and indexes, a bounded batch whose
/// entries follow `prev_log_id` one by one.
pub fn append(req: &AppendEntriesRequest<TypeConfig>, own: Own) -> Result<(), String> {
    check_vote(&req.vote, own)?;
    let term = req.vote.leader_id.term;
    check_log_id("previous log id", &req.prev_log_id, term)?;
    check_log_id("leader commit", &req.leader_commit, term)?;
    if req.entries.len() > MAX_ENTRIES {
        return Err(format!(
            "{} entries in one append; at most {MAX_ENTRIES}",
            req.entries.len()
        ));
    }
    let first = req.prev_log_id.map_or(0, |l| l.index + 1);
    for (want, e) in (first..).zip(&req.entries) {
        check_log_id("entry", &Some(e.log_id), term)?;
        if e.log_id.index != want {
            return Err(format!(
                "entry index {} where {want} was expected",
                e.log_id.index
            ));
        }
    }
    Ok(())
}

/// Check a snapshot chunk.
pub fn snapshot(req: &InstallSnapshotRequest<TypeConfig>, own: Own) -> Result<(), String> {
    check_vote(&req.vote, own)?;
    check_log_id(
        "snapshot last log id",
        &req.meta.last_log_id,
        req.vote.leader_id.term,
    )?;
    if req.offset > MAX_SNAPSHOT_OFFSET {
        return Err(format!("snapshot offset {} is out of range", req.offset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload};

    const OWN: Own = Own { term: 7 };

    fn vote_of(term: u64) -> Vote<u64> {
        Vote::new(term, 2)
    }

    fn log_id(term: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, 2), index)
    }

    #[test]
    fn test_the_repro_vote_is_refused_and_real_ones_pass() {
        // The request that once poisoned a cluster for good.
        let repro: VoteRequest<u64> = serde_json::from_str(
            r#"{"vote":{"leader_id":{"term":18446744073709551615,"node_id":2},"committed":false},"last_log_id":{"leader_id":{"term":18446744073709551615,"node_id":2},"index":9223372036854775808}}"#,
        )
        .unwrap();
        assert!(vote(&repro, OWN).unwrap_err().contains("term"));
        let ok = VoteRequest::new(vote_of(8), Some(log_id(7, 120)));
        vote(&ok, OWN).unwrap();
        // A node cut off for a long time campaigns with a high term: still accepted.
        let far = VoteRequest::new(vote_of(7 + 1_000_000), Some(log_id(7, 120)));
        vote(&far, OWN).unwrap();
        let huge_index = VoteRequest::new(vote_of(8), Some(log_id(7, 1 << 60)));
        assert!(vote(&huge_index, OWN).unwrap_err().contains("index"));
        let ahead = VoteRequest::new(vote_of(8), Some(log_id(9, 1)));
        assert!(vote(&ahead, OWN).unwrap_err().contains("above"));
    }

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    fn append_req(
        prev: Option<u64>,
        entries: Vec<Entry<TypeConfig>>,
    ) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(7, 2),
            prev_log_id: prev.map(|i| log_id(7, i)),
            entries,
            leader_commit: Some(log_id(7, 3)),
        }
    }

    #[test]
    fn test_appends_must_follow_their_previous_entry_and_stay_bounded() {
        append(&append_req(Some(4), vec![entry(7, 5), entry(7, 6)]), OWN).unwrap();
        append(&append_req(None, vec![entry(1, 0), entry(7, 1)]), OWN).unwrap();
        append(&append_req(Some(9), vec![]), OWN).unwrap();
        let gap = append_req(Some(4), vec![entry(7, 5), entry(7, 9)]);
        assert!(append(&gap, OWN).unwrap_err().contains("expected"));
        let future_term = append_req(Some(4), vec![entry(8, 5)]);
        assert!(append(&future_term, OWN).unwrap_err().contains("above"));
        let many = append_req(Some(0), (1..=5000).map(|i| entry(7, i)).collect());
        assert!(append(&many, OWN).unwrap_err().contains("entries"));
        let mut poisoned = append_req(Some(4), vec![]);
        poisoned.vote = Vote::new_committed(u64::MAX, 2);
        assert!(append(&poisoned, OWN).is_err());
    }
}
