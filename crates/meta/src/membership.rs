//! The leader's side of a join: add the node as a learner (or update its address);
//! whether and when it votes is the voter placement's call ([`crate::voters`], made
//! by the leader's [`crate::vote_keeper`] once the node is in the map with its zone).
//! And of a removal: a voter's vote first goes to the member the placement picks
//! (added as voter before the old one goes), then the node stops being a voter and
//! a learner. Runs under one lock so concurrent changes see each other.
use crate::meta::Meta;
use crate::remote::{post, retry, JoinRequest, Role, Wire};
use drove_types::clock::Instant;
use drove_types::{Error, ErrorKind};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long the leader waits for a new learner to catch up before promoting it.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(8);

/// How long the leader works on one join; below the joiner's call timeout (20 s).
const JOIN_SERVE_TIMEOUT: Duration = Duration::from_secs(15);

type WriteError = RaftError<u64, ClientWriteError<u64, BasicNode>>;

fn to_wire<T>(e: WriteError) -> Wire<T> {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => Wire::NotLeader {
            leader: f.leader_node.map(|n| n.addr),
        },
        // A membership change still in progress, a learner not yet known: retry.
        other => Wire::unavailable(format!("Membership change failed: {other}")),
    }
}

impl Meta {
    /// Serve `/meta/join` (leader only), giving up before the caller's timeout: a
    /// membership change cannot commit while the quorum is lost.
    pub(crate) async fn handle_join(&self, req: JoinRequest) -> Wire<Role> {
        match tokio::time::timeout(JOIN_SERVE_TIMEOUT, self.join_member(req)).await {
            Ok(w) => w,
            Err(_) => Wire::unavailable("Membership change not committed in time"),
        }
    }

    async fn join_member(&self, req: JoinRequest) -> Wire<Role> {
        if self.is_closed() {
            return Wire::unavailable("Metadata service stopped");
        }
        let _guard = self.membership_lock.lock().await;
        if let Some(redirect) = self.unless_leader() {
            return redirect;
        }
        if self.state().removed.contains(&drove_types::NodeId(req.id)) {
            return Wire::Err {
                kind: drove_types::ErrorKind::Gone,
                msg: format!(
                    "Node {} was removed from the cluster; to bring this host back, empty its \
                     data directory and join it as a new node",
                    req.id
                ),
            };
        }
        let level = self.state().settings.feature_level;
        let knows = req.features.max(drove_types::BASE_FEATURE_LEVEL);
        if knows < level {
            let (kind, msg) = crate::state::too_old(drove_types::NodeId(req.id), knows, level);
            tracing::warn!(node = req.id, knows, level, "refused a join: {msg}");
            return Wire::Err { kind, msg };
        }
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        let node = BasicNode {
            addr: req.addr.clone(),
        };
        let change = match membership.get_node(&req.id) {
            None => Some(ChangeMembers::AddNodes(BTreeMap::from([(req.id, node)]))),
            Some(known) if known.addr != req.addr => {
                Some(ChangeMembers::SetNodes(BTreeMap::from([(req.id, node)])))
            }
            Some(_) => None,
        };
        if let Some(change) = change {
            tracing::info!(node = req.id, addr = %req.addr, "adding or updating a metadata member");
            if let Err(e) = self.raft.change_membership(change, true).await {
                return to_wire(e);
            }
        }
        // The joiner's --max-voters is not used: the leader's bounds the voters.
        if membership.voter_ids().any(|v| v == req.id) {
            Wire::Ok(Role::Voter)
        } else {
            Wire::Ok(Role::Learner)
        }
    }

    /// `None` on the leader; elsewhere the answer that sends the caller to it.
    fn unless_leader<T>(&self) -> Option<Wire<T>> {
        match self.leader() {
            Some((id, _)) if id == self.id => None,
            other => Some(Wire::NotLeader {
                leader: other.map(|(_, addr)| addr),
            }),
        }
    }

    /// Serve `/meta/remove` (leader only), within the caller's timeout.
    pub(crate) async fn handle_remove(&self, id: u64) -> Wire<()> {
        match tokio::time::timeout(JOIN_SERVE_TIMEOUT, self.remove_here(id)).await {
            Ok(w) => w,
            Err(_) => Wire::unavailable("Membership change not committed in time"),
        }
    }

    async fn remove_here(&self, id: u64) -> Wire<()> {
        if self.is_closed() {
            return Wire::unavailable("Metadata service stopped");
        }
        let _guard = self.membership_lock.lock().await;
        if let Some(redirect) = self.unless_leader() {
            return redirect;
        }
        if id == self.id {
            return Wire::Err {
                kind: ErrorKind::Invalid,
                msg: format!(
                    "Node {id} is the metadata leader; stop its process so another node \
                     leads, then remove it"
                ),
            };
        }
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        // A node still running must learn of its removal (the RemoveNode entry) before
        // the leader stops replicating to it; otherwise it keeps serving, unaware.
        let alive = self
            .health
            .heard_within(drove_types::NodeId(id), Duration::from_secs(5));
        if alive && membership.get_node(&id).is_some() {
            if let Err(e) = self.wait_caught_up(id).await {
                tracing::warn!(
                    node = id,
                    "removing a member that has not seen its removal: {e}"
                );
            }
        }
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        if voters.contains(&id) {
            // The vote goes first to whom the placement picks without this node, so
            // the voters up never drop: add the new voter, then remove the old.
            let state = self.state();
            let members = self.voter_members(&state, Some(id));
            let grace = Duration::from_millis(state.settings.down_after_ms)
                * crate::vote_keeper::GRACE_TIMEOUTS;
            let p = crate::voters::plan(&members, self.id, self.cfg.max_voters, grace);
            if let Some(step @ crate::voters::Step::Promote(_)) = p.step {
                let why = format!("node {id} is being removed; wanted voters {:?}", p.voters);
                if let Err(e) = self.make(step, &state, &why).await {
                    tracing::warn!(node = id, "no voter added before the removal: {e}");
                }
            }
            tracing::info!(node = id, "removing a metadata voter");
            let change = ChangeMembers::RemoveVoters(BTreeSet::from([id]));
            if let Err(e) = self.raft.change_membership(change, false).await {
                return to_wire(e);
            }
        } else if membership.get_node(&id).is_some() {
            tracing::info!(node = id, "removing a metadata learner");
            let change = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
            if let Err(e) = self.raft.change_membership(change, false).await {
                return to_wire(e);
            }
        }
        Wire::Ok(())
    }

    /// Take node `id` out of the metadata membership (voter or learner), asking the
    /// leader wherever it is. Done when the node is no member.
    pub async fn remove_member(&self, id: u64) -> Result<(), Error> {
        let deadline = Instant::now() + JOIN_SERVE_TIMEOUT + Duration::from_secs(5);
        retry(deadline, "Cannot remove the metadata member", |hint| {
            let target = hint.or_else(|| self.leader().map(|(_, addr)| addr));
            async move {
                match target {
                    Some(addr) => {
                        let timeout = JOIN_SERVE_TIMEOUT + Duration::from_secs(2);
                        post(&self.client, &addr, "/meta/remove", &id, timeout).await
                    }
                    None => crate::remote::Attempt::Retry {
                        hint: None,
                        why: "no metadata leader known".to_string(),
                    },
                }
            }
        })
        .await
    }

    pub(crate) async fn wait_caught_up(&self, id: u64) -> Result<(), String> {
        let target = self.raft.metrics().borrow().last_log_index;
        self.raft
            .wait(Some(CATCH_UP_TIMEOUT))
            .metrics(
                move |m| {
                    let matched = m
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(&id).cloned().flatten())
                        .map(|l| l.index);
                    matched >= target
                },
                "learner caught up",
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl Meta {
    /// Refuse to raise the cluster to feature level `level` while a metadata member
    /// is not in the map as a node that knows it: such a member (a node that joined
    /// and has not recorded itself yet) would be sent a log entry it cannot read.
    /// The state machine checks the map's nodes again when the command applies.
    pub(crate) fn members_know(&self, level: u32) -> drove_types::Result<()> {
        let state = self.state();
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let unknown: Vec<String> = membership
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .filter(|id| {
                state
                    .map
                    .nodes
                    .get(&drove_types::NodeId(*id))
                    .is_none_or(|n| n.feature_level() < level)
            })
            .map(|id| id.to_string())
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        Err(drove_types::Error::new(
            drove_types::ErrorKind::Invalid,
            format!(
                "Cannot raise the cluster to feature level {level}: metadata member(s) {} \
                 do not run a build that knows it (or have not recorded themselves yet)",
                unknown.join(", ")
            ),
        ))
    }
}
