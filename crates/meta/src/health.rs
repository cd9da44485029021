//! Failure detection. Every node sends a heartbeat to the metadata leader each second
//! (`POST /meta/heartbeat`); the leader remembers when it last heard from each node,
//! in memory only (heartbeats are not Raft entries: a second's liveness is not worth
//! a log write on every member). The leader marks a node down when it has been silent
//! for [`crate::Settings::down_after_ms`], or when the node says its disk is full,
//! and marks it up again when healthy heartbeats return; each change is a
//! `SetNodeState` command, so it bumps the epoch and lands in the epoch history.
//!
//! A new leader first waits one full timeout before judging anyone, so that nodes
//! have had time to find it: silence towards a leader elected a second ago is not
//! the node's fault.
//!
//! A node a gateway marked down because it went silent is held down for the
//! cluster's hold-down ([`crate::Settings::hold_down_ms`], a minute by default)
//! whatever its heartbeats say, so a node that stalls now and then flips at most
//! once per hold.
//!
//! A node marked down (by this detector or by a gateway whose writes to it failed)
//! comes back up only on a heartbeat received after the leader saw it down: one sent
//! before says nothing about whether it is alive now, and bringing a dead node back
//! on it sends writes to it again (each flip an epoch, each failed write a client
//! error).
//!
//! Each verdict carries the Raft term it was judged in and is refused if committed
//! in another ([`Command::JudgeNodeState`]): a leader cut off from the majority hears
//! nobody, and its verdicts must not be applied by the next leader after the heal.
//!
//! A heartbeat also says the epoch at which the node's recovery is clean, if it is.
//! When every node of the map is up and clean at the current epoch, the leader
//! trims the epoch history to it ([`Command::TrimHistory`]): no earlier map is
//! needed any more.
use crate::meta::Meta;
use crate::state::Command;
use drove_types::clock::Instant;
use drove_types::{ClusterMap, Epoch, NodeId, NodeState};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How often a node sends a heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(1000);

/// How often the leader looks for silent nodes.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// One heartbeat.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The sender.
    pub node: NodeId,
    /// False when the node cannot store data (its disk is full): keep it down.
    pub healthy: bool,
    /// The epoch at which the node's recovery is clean (every copy placed on it
    /// at that epoch made current), when it is now; `None` while it recovers (and
    /// from nodes that predate the field).
    #[serde(default)]
    pub clean: Option<Epoch>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Instant,
    healthy: bool,
    clean: Option<Epoch>,
}

/// What the leader knows of the nodes' liveness.
#[derive(Default)]
pub(crate) struct Health {
    seen: Mutex<HashMap<NodeId, Seen>>,
    leader_since: Mutex<Option<Instant>>,
    /// When this node first saw each down node down.
    down_since: Mutex<HashMap<NodeId, Instant>>,
    /// When a leader last answered this node's heartbeat saying a majority had
    /// acknowledged it lately (see [`Meta::quorum_age`]).
    confirmed: Mutex<Option<Instant>>,
    /// When this node first saw its openraft core stopped for good.
    stopped_at: Mutex<Option<Instant>>,
}

impl Health {
    pub(crate) fn record(&self, hb: Heartbeat) {
        let mut seen = self.seen.lock();
        seen.insert(
            hb.node,
            Seen {
                at: Instant::now(),
                healthy: hb.healthy,
                clean: hb.clean,
            },
        );
    }

    /// Whether `node` sent a heartbeat within `within` (known on the leader only).
    pub(crate) fn heard_within(&self, node: NodeId, within: Duration) -> bool {
        self.seen
            .lock()
            .get(&node)
            .is_some_and(|s| s.at.elapsed() <= within)
    }

    /// The state each node should be in, or nothing while this leader is too new to
    /// judge. `now` and the leadership start are passed in for testability.
    fn verdicts(
        &self,
        nodes: impl Iterator<Item = (NodeId, NodeState)>,
        down_after: Duration,
        now: Instant,
    ) -> Vec<(NodeId, NodeState)> {
        let nodes: Vec<(NodeId, NodeState)> = nodes.collect();
        let mut down_since = self.down_since.lock();
        down_since.retain(|id, _| nodes.contains(&(*id, NodeState::Down)));
        for &(id, state) in &nodes {
            if state == NodeState::Down {
                down_since.entry(id).or_insert(now);
            }
        }
        let since = *self.leader_since.lock();
        let Some(since) = since else {
            return Vec::new();
        };
        if now.saturating_duration_since(since) < down_after {
            return Vec::new();
        }
        let seen = self.seen.lock();
        nodes
            .into_iter()
            .filter_map(|(id, state)| {
                let alive = seen.get(&id).is_some_and(|s| {
                    s.healthy
                        && now.saturating_duration_since(s.at) < down_after
                        && down_since.get(&id).is_none_or(|&d| s.at > d)
                });
                let want = if alive {
                    NodeState::Up
                } else {
                    NodeState::Down
                };
                (want != state).then_some((id, want))
            })
            .collect()
    }

    /// The epoch to trim the history to ([`Command::TrimHistory`]): the map's own,
    /// when every node of it is up and said in a heartbeat received within
    /// `within` of `now` that it is clean at that epoch, and the history still
    /// starts earlier (`first_kept`).
    fn trim_point(
        &self,
        map: &ClusterMap,
        first_kept: Option<Epoch>,
        within: Duration,
        now: Instant,
    ) -> Option<Epoch> {
        if first_kept.is_none_or(|f| f >= map.epoch) || map.nodes.is_empty() {
            return None;
        }
        let seen = self.seen.lock();
        map.nodes
            .values()
            .all(|n| {
                n.state == NodeState::Up
                    && seen.get(&n.id).is_some_and(|s| {
                        s.clean == Some(map.epoch) && now.saturating_duration_since(s.at) < within
                    })
            })
            .then_some(map.epoch)
    }

    fn set_leader(&self, leader: bool) {
        let mut since = self.leader_since.lock();
        match (leader, since.is_some()) {
            (true, false) => *since = Some(Instant::now()),
            (false, true) => *since = None,
            _ => {}
        }
    }
}

impl Meta {
    /// `POST /meta/heartbeat`: recorded by whoever receives it; only the leader's
    /// record is ever used, and senders aim at the leader. True from a leader that
    /// a majority acknowledged lately.
    pub(crate) fn receive_heartbeat(&self, hb: Heartbeat) -> bool {
        // Only members' heartbeats are kept: the table must not grow with made-up ids.
        if self.state().map.node(hb.node).is_some() {
            self.health.record(hb);
        } else {
            tracing::debug!(node = %hb.node, "ignored a heartbeat from a node not in the map");
        }
        // True from a leader that a majority acknowledged lately: the sender may then
        // say it knows a working metadata cluster.
        let leading = self.status().leader == Some(self.node_id());
        leading && self.quorum_age().is_some_and(|a| a < QUORUM_FRESH)
    }
}

/// How recent a majority's acknowledgement must be for a node to say it has one.
pub const QUORUM_FRESH: Duration = Duration::from_secs(3);

impl Meta {
    /// Send this node's heartbeat to the leader every second, with `healthy()` telling
    /// whether its store can take data and `clean()` the epoch its recovery is clean
    /// at; on the leader, also mark silent nodes down and returning ones up, and trim
    /// the epoch history once every node is clean. Runs until the metadata service
    /// shuts down.
    pub async fn run_health(
        self: Arc<Self>,
        healthy: impl Fn() -> bool + Send + 'static,
        clean: impl Fn() -> Option<Epoch> + Send + 'static,
    ) {
        let me = self.node_id();
        let mut last_beat = Instant::now() - HEARTBEAT_EVERY;
        while !self.is_closed() {
            let status = self.status();
            let leading = status.leader == Some(me);
            self.health.set_leader(leading);
            if last_beat.elapsed() >= HEARTBEAT_EVERY {
                last_beat = Instant::now();
                let hb = Heartbeat {
                    node: me,
                    healthy: healthy(),
                    clean: clean(),
                };
                if leading {
                    self.health.record(hb);
                } else if let Some(leader) = status.leader {
                    self.send_heartbeat(leader, hb).await;
                }
            }
            if leading {
                self.judge(status.term).await;
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }

    async fn send_heartbeat(&self, leader: NodeId, hb: Heartbeat) {
        // The leader's Raft address (its peer port), where the internal routes are.
        let Some(addr) = self.raft_addr(leader.0) else {
            return;
        };
        let res = self
            .client
            .post_json(&addr, "/meta/heartbeat", &hb, HEARTBEAT_EVERY)
            .await;
        match res {
            Ok(r) => {
                if let Ok(true) = serde_json::from_slice::<bool>(&r.body) {
                    *self.health.confirmed.lock() = Some(Instant::now());
                }
            }
            Err(e) => tracing::debug!("heartbeat to {addr} failed: {}", e.why()),
        }
    }

    /// How long ago this node last knew of a working metadata majority: as leader,
    /// since a majority acknowledged it; otherwise since the leader answered a
    /// heartbeat saying it had one. `None`: not since this process started. A node
    /// cut off from the majority keeps its last view of the cluster; this says how
    /// old that view may be.
    pub fn quorum_age(&self) -> Option<Duration> {
        let m = self.raft.metrics().borrow().clone();
        if m.running_state.is_err() {
            // openraft stopped for good: its metrics are frozen as they were, and
            // the leader may still answer this node's heartbeats. It knows of no
            // working majority since it stopped.
            let stopped_at = *self
                .health
                .stopped_at
                .lock()
                .get_or_insert_with(Instant::now);
            let confirmed = self.health.confirmed.lock().filter(|&c| c < stopped_at);
            return Some(confirmed.unwrap_or(stopped_at).elapsed());
        }
        if m.current_leader == Some(self.id) {
            return m.millis_since_quorum_ack.map(Duration::from_millis);
        }
        self.health.confirmed.lock().map(|t| t.elapsed())
    }

    /// Why this node's openraft core stopped for good (a storage error such as a
    /// full disk: openraft does not go on after one), or `None` while it runs or
    /// after a clean shutdown.
    pub fn stopped(&self) -> Option<String> {
        match &self.raft.metrics().borrow().running_state {
            Ok(()) | Err(openraft::error::Fatal::Stopped) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// Wait until this node's openraft core stops for good ([`Meta::stopped`]);
    /// the reason.
    pub async fn wait_stopped(&self) -> String {
        let mut rx = self.raft.metrics();
        loop {
            if let Some(why) = self.stopped() {
                return why;
            }
            if rx.changed().await.is_err() {
                return self
                    .stopped()
                    .unwrap_or_else(|| "the metadata Raft core ended".to_string());
            }
        }
    }

    async fn judge(&self, term: u64) {
        let state = self.state();
        let down_after = Duration::from_millis(state.settings.down_after_ms);
        let nodes = state.map.nodes.values().map(|n| (n.id, n.state));
        let now_ms = crate::meta::unix_now_ms();
        let held = |id: &NodeId| state.held_down.get(id).is_some_and(|&until| until > now_ms);
        let verdicts: Vec<(NodeId, NodeState)> = self
            .health
            .verdicts(nodes, down_after, Instant::now())
            .into_iter()
            .filter(|(id, s)| *s != NodeState::Up || !held(id))
            .collect();
        if verdicts.is_empty() {
            self.trim_history(&state, down_after).await;
            return;
        }
        for (id, state) in &verdicts {
            tracing::warn!(node = %id, ?state, term, "failure detector changes a node's state");
        }
        // All of this round's verdicts in one command: one epoch for a datacenter
        // lost, not one per node.
        let n = verdicts.len();
        if let Err(e) = self.execute(Command::JudgeNodes { verdicts, term }).await {
            tracing::warn!(nodes = n, "cannot change the nodes' states: {e}");
        }
    }
}

impl Meta {
    /// Trim the epoch history when every node is up and clean at the current
    /// epoch (see [`Health::trim_point`]).
    async fn trim_history(&self, state: &crate::MetaState, within: Duration) {
        let first = state.epoch_history.first().map(|r| r.epoch);
        let Some(keep_from) = self
            .health
            .trim_point(&state.map, first, within, Instant::now())
        else {
            return;
        };
        let dropped = state.epoch_history.len().saturating_sub(1);
        match self.execute(Command::TrimHistory { keep_from }).await {
            Ok(_) => tracing::info!(
                epoch = %keep_from, dropped,
                "every node is up and clean: epoch history trimmed to the current epoch"
            ),
            Err(e) => tracing::warn!(epoch = %keep_from, "cannot trim the epoch history: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[(u64, NodeState)]) -> Vec<(NodeId, NodeState)> {
        v.iter().map(|&(i, s)| (NodeId(i), s)).collect()
    }

    #[test]
    fn test_silent_nodes_go_down_and_healthy_ones_come_back_after_the_grace_period() {
        let h = Health::default();
        let t0 = Instant::now();
        let d = Duration::from_secs(5);
        let nodes = ids(&[(1, NodeState::Up), (2, NodeState::Up), (3, NodeState::Down)]);
        // Not the leader yet: no verdicts at all.
        assert!(h.verdicts(nodes.clone().into_iter(), d, t0).is_empty());
        h.set_leader(true);
        h.record(Heartbeat {
            node: NodeId(1),
            healthy: true,
            clean: None,
        });
        h.record(Heartbeat {
            node: NodeId(3),
            healthy: true,
            clean: None,
        });
        // A fresh leader waits a whole timeout before judging.
        assert!(h
            .verdicts(nodes.clone().into_iter(), d, Instant::now())
            .is_empty());
        let later = Instant::now() + Duration::from_secs(6);
        // Nobody heard from within 5 s of `later`: 1 and 2 go down; 3 stays down.
        assert_eq!(
            h.verdicts(nodes.clone().into_iter(), d, later),
            ids(&[(1, NodeState::Down), (2, NodeState::Down)])
        );
        // Leader for long enough, heard from 1 and 3 just now, 2 never: 3 comes back
        // up, 2 goes down.
        *h.leader_since.lock() = Some(t0 - Duration::from_secs(10));
        assert_eq!(
            h.verdicts(nodes.clone().into_iter(), d, Instant::now()),
            ids(&[(2, NodeState::Down), (3, NodeState::Up)])
        );
        // A node that says its disk is full is kept down.
        h.record(Heartbeat {
            node: NodeId(1),
            healthy: false,
            clean: None,
        });
        assert_eq!(
            h.verdicts(nodes.into_iter(), d, Instant::now()),
            ids(&[
                (1, NodeState::Down),
                (2, NodeState::Down),
                (3, NodeState::Up)
            ])
        );
        // Losing leadership forgets the grace period.
        h.set_leader(false);
        assert!(h
            .verdicts(ids(&[(2, NodeState::Up)]).into_iter(), d, Instant::now())
            .is_empty());
    }

    #[test]
    fn test_a_node_marked_down_comes_back_only_on_a_newer_heartbeat() {
        let h = Health::default();
        let d = Duration::from_secs(5);
        h.set_leader(true);
        *h.leader_since.lock() = Some(Instant::now() - Duration::from_secs(10));
        let beat = |n| {
            h.record(Heartbeat {
                node: NodeId(n),
                healthy: true,
                clean: None,
            })
        };
        beat(3);
        let up = ids(&[(3, NodeState::Up)]);
        assert!(h.verdicts(up.into_iter(), d, Instant::now()).is_empty());
        // A gateway's writes to node 3 failed and it marked it down; node 3's last
        // heartbeat is a moment old, but it was sent before: node 3 stays down.
        std::thread::sleep(Duration::from_millis(2));
        let down = ids(&[(3, NodeState::Down)]);
        assert!(h
            .verdicts(down.clone().into_iter(), d, Instant::now())
            .is_empty());
        assert!(h
            .verdicts(down.clone().into_iter(), d, Instant::now())
            .is_empty());
        // A heartbeat sent after it was seen down brings it back.
        std::thread::sleep(Duration::from_millis(2));
        beat(3);
        assert_eq!(
            h.verdicts(down.into_iter(), d, Instant::now()),
            ids(&[(3, NodeState::Up)])
        );
        // Once up, a later mark-down is judged from that moment again.
        let up = ids(&[(3, NodeState::Up)]);
        assert!(h.verdicts(up.into_iter(), d, Instant::now()).is_empty());
        std::thread::sleep(Duration::from_millis(2));
        let down = ids(&[(3, NodeState::Down)]);
        assert!(h.verdicts(down.into_iter(), d, Instant::now()).is_empty());
    }

    #[test]
    fn test_the_history_is_trimmed_once_every_node_is_up_and_clean_at_the_map_epoch() {
        let h = Health::default();
        let d = Duration::from_secs(5);
        let mut map = ClusterMap {
            epoch: Epoch(7),
            ..Default::default()
        };
        for i in 1..=3 {
            map.nodes
                .insert(NodeId(i), drove_types::NodeInfo::new(NodeId(i), "z"));
        }
        let beat = |n, clean: Option<u64>| {
            h.record(Heartbeat {
                node: NodeId(n),
                healthy: true,
                clean: clean.map(Epoch),
            })
        };
        let now = || Instant::now();
        beat(1, Some(7));
        beat(2, Some(7));
        // Node 3 still recovers, then is clean at an older epoch: no trim.
        beat(3, None);
        assert_eq!(h.trim_point(&map, Some(Epoch(2)), d, now()), None);
        beat(3, Some(6));
        assert_eq!(h.trim_point(&map, Some(Epoch(2)), d, now()), None);
        beat(3, Some(7));
        assert_eq!(h.trim_point(&map, Some(Epoch(2)), d, now()), Some(Epoch(7)));
        // Already trimmed to it: nothing to do.
        assert_eq!(h.trim_point(&map, Some(Epoch(7)), d, now()), None);
        assert_eq!(h.trim_point(&map, None, d, now()), None);
        // A node down, or one last heard from too long ago: no trim.
        map.nodes.get_mut(&NodeId(2)).unwrap().state = NodeState::Down;
        assert_eq!(h.trim_point(&map, Some(Epoch(2)), d, now()), None);
        map.nodes.get_mut(&NodeId(2)).unwrap().state = NodeState::Up;
        let later = now() + Duration::from_secs(6);
        assert_eq!(h.trim_point(&map, Some(Epoch(2)), d, later), None);
        // A node never heard from at all.
        map.nodes
            .insert(NodeId(4), drove_types::NodeInfo::new(NodeId(4), "z"));
        assert_eq!(h.trim_point(&map, Some(Epoch(2)), d, now()), None);
    }
}
