//! The leader's keeper of the voter placement: every half second the leader reads
//! the membership and the map, asks [`crate::voters::plan`] for the next change and
//! makes it with openraft, one at a time under the membership lock (joins and
//! removals take it too). A learner is promoted only once it has caught up with the
//! leader's log, so counting it in the quorum cannot stall commits; a demoted voter
//! stays a learner.
//!
//! How long a member has been down comes from the epoch history (when the map first
//! showed it down in the run of epochs up to now), so a new leader judges the grace
//! as the old one did instead of starting the count again.
use crate::meta::{unix_now, Meta};
use crate::state::{EpochRecord, MetaState};
use crate::voters::{plan, Member, Standing, Step};
use drove_types::{NodeId, NodeState};
use openraft::ChangeMembers;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often the leader looks at the voters.
const KEEP_EVERY: Duration = Duration::from_millis(500);

/// How long one change may take (a change cannot commit while the quorum is lost).
const CHANGE_TIMEOUT: Duration = Duration::from_secs(15);

/// A voter marked down keeps its vote this many failure timeouts
/// ([`crate::Settings::down_after_ms`]) while another member could take it.
pub(crate) const GRACE_TIMEOUTS: u32 = 2;

/// The unix time (seconds) since which the map has shown node `id` down without a
/// break, from `history` (oldest first) and the current map state `down_now`;
/// `None` when it is not down, or the history does not tell (then: just now).
pub(crate) fn down_since(history: &[EpochRecord], id: NodeId, down_now: bool) -> Option<u64> {
    if !down_now {
        return None;
    }
    let mut since = None;
    for r in history.iter().rev() {
        match r.map.node(id) {
            Some(n) if n.state == NodeState::Down => since = Some(r.at_unix),
            _ => break,
        }
    }
    since
}

impl Meta {
    /// Keep the voters placed as [`crate::voters`] says, while this node leads; runs
    /// until the metadata service stops.
    pub(crate) async fn run_vote_keeper(self: Arc<Self>) {
        while !self.is_closed() {
            tokio::time::sleep(KEEP_EVERY).await;
            if self.leader().is_none_or(|(id, _)| id != self.id) {
                continue;
            }
            // A leader cut off from the majority cannot commit a change: do not try.
            if self
                .quorum_age()
                .is_none_or(|a| a >= crate::health::QUORUM_FRESH)
            {
                continue;
            }
            let _guard = self.membership_lock.lock().await;
            let state = self.state();
            let members = self.voter_members(&state, None);
            let grace = Duration::from_millis(state.settings.down_after_ms) * GRACE_TIMEOUTS;
            let p = plan(&members, self.id, self.cfg.max_voters, grace);
            let Some(step) = p.step else { continue };
            let why = format!("wanted voters {:?}", p.voters);
            if let Err(e) = self.make(step, &state, &why).await {
                tracing::warn!(?step, "cannot change the metadata voters: {e}");
            }
        }
    }

    /// The members as the placement sees them: voters and learners of this node's
    /// membership, with their zones and standing from `state`; `gone` is counted as
    /// out of the map (a node being removed).
    pub(crate) fn voter_members(&self, state: &MetaState, gone: Option<u64>) -> Vec<Member> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let now = unix_now();
        membership
            .nodes()
            .map(|(id, _)| *id)
            .map(|id| {
                let node = state.map.node(NodeId(id)).filter(|_| Some(id) != gone);
                let standing = match node {
                    Some(n) if n.state == NodeState::Down => {
                        let since = down_since(&state.epoch_history, n.id, true).unwrap_or(now);
                        Standing::Down(Duration::from_secs(now.saturating_sub(since)))
                    }
                    Some(n) if !n.may_vote() => Standing::Leaving,
                    _ => Standing::Up,
                };
                Member {
                    id,
                    voter: voters.contains(&id),
                    zone: node.map(|n| n.zone.clone()),
                    standing,
                    witness: node.is_some_and(|n| n.witness),
                }
            })
            .collect()
    }

    /// Make one change: promote a learner once it caught up, or demote a voter to
    /// learner.
    pub(crate) async fn make(
        &self,
        step: Step,
        state: &MetaState,
        why: &str,
    ) -> Result<(), String> {
        let zone = |id: u64| {
            state
                .map
                .node(NodeId(id))
                .map_or("?".to_string(), |n| n.zone.clone())
        };
        let change = match step {
            Step::Promote(id) => {
                self.wait_caught_up(id).await?;
                tracing::info!(node = id, zone = %zone(id), why, "promoting a metadata learner to voter");
                ChangeMembers::AddVoterIds(BTreeSet::from([id]))
            }
            Step::Demote(id) => {
                tracing::info!(node = id, zone = %zone(id), why, "making a metadata voter a learner");
                ChangeMembers::RemoveVoters(BTreeSet::from([id]))
            }
        };
        match tokio::time::timeout(CHANGE_TIMEOUT, self.raft.change_membership(change, true)).await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("not committed within {CHANGE_TIMEOUT:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::{ClusterMap, Epoch, NodeInfo};

    fn record(epoch: u64, at: u64, down: &[u64]) -> EpochRecord {
        let mut map = ClusterMap {
            epoch: Epoch(epoch),
            ..Default::default()
        };
        for id in 1..=3 {
            let mut n = NodeInfo::new(NodeId(id), "z");
            if down.contains(&id) {
                n.state = NodeState::Down;
            }
            map.nodes.insert(NodeId(id), n);
        }
        EpochRecord {
            epoch: Epoch(epoch),
            at_unix: at,
            change: String::new(),
            map,
        }
    }

    #[test]
    fn test_down_since_is_the_start_of_the_last_unbroken_run_of_epochs_down() {
        let h = vec![
            record(1, 100, &[]),
            record(2, 110, &[2]),
            record(3, 120, &[]),
            record(4, 130, &[2]),
            record(5, 140, &[2, 3]),
        ];
        // Node 2 went down at 110, came back at 120, down again since 130.
        assert_eq!(down_since(&h, NodeId(2), true), Some(130));
        assert_eq!(down_since(&h, NodeId(3), true), Some(140));
        assert_eq!(down_since(&h, NodeId(1), false), None);
        // Down now but the history ends before it (or says otherwise): unknown.
        assert_eq!(down_since(&h, NodeId(1), true), None);
        assert_eq!(down_since(&[], NodeId(2), true), None);
    }
}
