//! The cluster map and its epochs: handing out node ids, nodes joining, changing,
//! marked up or down (by an operator or the failure detector) and removed, and the
//! epoch history each change grows (trimmed once every node was up and clean).
//! Every change of placement makes one epoch ([`MetaState::bump_epoch`]).
use super::{
    invalid, ApplyResult, EpochNote, EpochRecord, MetaState, Reply, MAX_HOLD_DOWN_MS,
    MAX_TRIMMED_NOTES, MAX_VERDICTS, MAX_WEIGHT,
};
use drove_types::{validate_name, Epoch, ErrorKind, NodeId, NodeInfo, NodeState};
use std::sync::Arc;

impl MetaState {
    /// [`super::Command::AllocateNodeId`].
    pub(super) fn allocate_node_id(&mut self) -> ApplyResult {
        let id = NodeId(self.next_node_id);
        self.next_node_id += 1;
        Ok(Reply::NodeId(id))
    }

    /// [`super::Command::UpsertNode`].
    pub(super) fn apply_upsert_node(&mut self, node: &NodeInfo, now: u64) -> ApplyResult {
        check_node(node, self.next_node_id, &self.removed)?;
        if let Some(old) = self.map.nodes.get(&node.id) {
            if old.witness != node.witness {
                let (was, now_is) = match old.witness {
                    true => ("a witness", "a data node"),
                    false => ("a data node", "a witness"),
                };
                return Err((
                    ErrorKind::Invalid,
                    format!(
                        "Node {} joined as {was} and cannot come back as {now_is}: \
                         remove it (drove node leave) and join the host as a new node",
                        node.id
                    ),
                ));
            }
        }
        let level = self.settings.feature_level;
        if node.feature_level() < level {
            return Err(too_old(node.id, node.feature_level(), level));
        }
        if self.map.nodes.is_empty() {
            // The first node of a new cluster sets its level: no older build is
            // a member yet. (A cluster begun before levels existed stays at 1.)
            self.settings.feature_level = node.feature_level();
        }
        self.upsert_node(node, now);
        Ok(Reply::Done)
    }

    /// Refuse a command of a feature level above the cluster's: a member of an older
    /// build could not read it.
    pub(crate) fn check_feature_level(
        &self,
        cmd: &super::Command,
    ) -> Result<(), (ErrorKind, String)> {
        let needs = cmd.feature_level();
        let level = self.settings.feature_level;
        if needs <= level || matches!(cmd, super::Command::FinishUpgrade { .. }) {
            return Ok(());
        }
        Err((
            ErrorKind::Invalid,
            format!(
                "{} need cluster feature level {needs}, and the cluster is at level {level}: \
                 once every node runs a build that knows level {needs}, run `drove cluster \
                 upgrade finish`",
                upper_first(drove_types::feature_name(needs))
            ),
        ))
    }

    /// [`super::Command::FinishUpgrade`]: every node in the map must know `level`.
    pub(super) fn finish_upgrade(&mut self, level: u32) -> ApplyResult {
        let now = self.settings.feature_level;
        if level <= now {
            return Err(invalid(format!(
                "The cluster is already at feature level {now} (asked for {level})"
            )));
        }
        let behind: Vec<String> = self
            .map
            .nodes
            .values()
            .filter(|n| n.feature_level() < level)
            .map(|n| format!("node {} knows level {}", n.id, n.feature_level()))
            .collect();
        if !behind.is_empty() {
            return Err(invalid(format!(
                "Cannot raise the cluster to feature level {level}: {}; upgrade them (or \
                 remove them with `drove node remove`) first",
                behind.join(", ")
            )));
        }
        self.settings.feature_level = level;
        Ok(Reply::Done)
    }

    /// Refuse a gateway's verdict its judge had no right to (from feature level 3;
    /// see [`super::Command::SetNodeState`]'s `judged`): the judge is not in the
    /// cluster or is down, its map is from the future or older than the epoch
    /// history, or it was marked down at an epoch after its map. Refused with
    /// `StaleEpoch`: the gateway sends its request again once its map is newer,
    /// and judges again if the replicas still fail.
    ///
    /// From feature level 4 a verdict on a node of another zone is refused too when,
    /// since the judge's map, another node of the judge's zone was marked down: the
    /// judge was most likely cut off with its zone (seed 4181, below).
    pub(super) fn check_judge(
        &self,
        subject: NodeId,
        judged: Option<&super::Judged>,
    ) -> Result<(), (ErrorKind, String)> {
        let Some(j) = judged else {
            return Ok(());
        };
        if self.settings.feature_level < 3 {
            return Ok(());
        }
        let now = self.map.epoch;
        let stale = |why: String| {
            Err((
                ErrorKind::StaleEpoch,
                format!(
                    "Node {}'s verdict on its map of epoch {} is refused: {why}",
                    j.by, j.seen
                ),
            ))
        };
        if j.seen > now {
            return Err(invalid(format!(
                "Node {}'s verdict names epoch {}, and the cluster is at epoch {now}",
                j.by, j.seen
            )));
        }
        match self.map.nodes.get(&j.by) {
            None => return stale(format!("node {} is not in the cluster", j.by)),
            Some(n) if n.state != NodeState::Up => {
                return stale(format!("node {} is down now", j.by))
            }
            Some(_) => {}
        }
        // The history's first epoch is at most the current one.
        let first = self.epoch_history.first().map_or(now, |r| r.epoch);
        if j.seen < first {
            return stale(format!("epochs before {first} are no longer known"));
        }
        if let Some((_, at)) = self.first_down_after(j.seen, &[j.by]) {
            return stale(format!(
                "node {} was down at epoch {at} (its view was cut off or behind)",
                j.by
            ));
        }
        if self.settings.feature_level >= 4 {
            if let Some((mate, at)) = self.zone_mate_down_since(subject, j) {
                return stale(format!(
                    "node {mate}, in the same zone as node {}, was marked down at epoch {at} \
                     (node {} was likely cut off with its zone)",
                    j.by, j.by
                ));
            }
        }
        Ok(())
    }

    /// A node of the judge's zone, not the judge, that was up in the judge's map and
    /// down at a later epoch, when the verdict's subject is in another zone; with
    /// the epoch it was down at. A zone cut off from the rest judges the nodes across
    /// the cut silent, while the rest marks its nodes down; the judge itself may be
    /// missed when no write needed it (`drove sim faults --meta raft --seed 4181
    /// --time 20s`: zone z3 cut off for 2.8 s; its gateway's verdict, committed
    /// 0.6 s after the heal, marked both home copies of a zone-sync VDI down,
    /// after nodes 8 and 9 of z3 were marked down by the other side; the copy then
    /// placed in the home zone was recovered from the far copy, which lacked
    /// writes acknowledged durable, and the home copies took that copy when they
    /// came back). Refused, the gateway sends its request again on its new map and
    /// judges again if the node still fails, at the cost of one more silence when
    /// two nodes of two zones truly fail at once. The judge's own verdicts on its
    /// zone-mates do not count against it when made in one batch: the gateway
    /// sends those on other zones first (`MetaMembership`).
    fn zone_mate_down_since(&self, subject: NodeId, j: &super::Judged) -> Option<(NodeId, Epoch)> {
        let zone = &self.map.nodes.get(&j.by)?.zone;
        let subject_zone = &self.map.nodes.get(&subject)?.zone;
        if zone == subject_zone {
            return None;
        }
        let seen = self.epoch_history.iter().find(|r| r.epoch == j.seen)?;
        let mates: Vec<NodeId> = seen
            .map
            .nodes
            .values()
            .filter(|n| n.id != j.by && &n.zone == zone && n.state == NodeState::Up)
            .map(|n| n.id)
            .collect();
        self.first_down_after(j.seen, &mates)
    }

    /// The first of `nodes` down (or gone) in a map of the epoch history after
    /// epoch `seen`, with that map's epoch.
    fn first_down_after(&self, seen: Epoch, nodes: &[NodeId]) -> Option<(NodeId, Epoch)> {
        self.epoch_history
            .iter()
            .filter(|r| r.epoch > seen)
            .find_map(|r| {
                nodes
                    .iter()
                    .find(|m| r.map.nodes.get(m).is_none_or(|n| n.state != NodeState::Up))
                    .map(|m| (*m, r.epoch))
            })
    }

    /// [`super::Command::SetNodeState`]: an operator's or a gateway's verdict, with
    /// its reason and hold-down.
    pub(super) fn apply_set_node_state(
        &mut self,
        id: NodeId,
        state: NodeState,
        reason: &str,
        hold_ms: u64,
        now: u64,
    ) -> ApplyResult {
        if hold_ms > MAX_HOLD_DOWN_MS || reason.len() > 1024 {
            return Err(invalid(format!(
                "Bad node verdict: hold {hold_ms} ms (at most {MAX_HOLD_DOWN_MS}), reason of {} bytes (at most 1024)",
                reason.len()
            )));
        }
        self.set_node_state(id, state, reason, now)?;
        if state == NodeState::Down && hold_ms > 0 {
            self.held_down
                .insert(id, now.saturating_mul(1000).saturating_add(hold_ms));
        }
        Ok(Reply::Done)
    }

    /// [`super::Command::JudgeNodeState`] (its term was checked by the state machine).
    pub(super) fn judge_node_state(
        &mut self,
        id: NodeId,
        state: NodeState,
        now: u64,
    ) -> ApplyResult {
        self.set_node_state(id, state, "by the failure detector", now)?;
        Ok(Reply::Done)
    }

    /// [`super::Command::RemoveNode`].
    pub(super) fn remove_node(&mut self, id: NodeId, now: u64) -> ApplyResult {
        let Some(node) = self.map.nodes.get(&id) else {
            return Err((ErrorKind::NotFound, format!("No node {id} in the cluster")));
        };
        if node.state == NodeState::Up && node.weight > 0 {
            return Err((
                ErrorKind::Invalid,
                format!(
                    "Node {id} is up and holds data: `drove node leave {id}` drains \
                     it first, then removes it"
                ),
            ));
        }
        self.map.nodes.remove(&id);
        self.removed.insert(id);
        self.bump_epoch(now, format!("node {id} removed"));
        Ok(Reply::Done)
    }

    /// [`Command::TrimHistory`].
    pub(super) fn trim_history(&mut self, keep_from: Epoch) -> ApplyResult {
        let Some(at) = self.epoch_history.iter().position(|r| r.epoch == keep_from) else {
            return Err(invalid(format!(
                "Epoch {keep_from} is not in the epoch history (epochs {} to {})",
                self.epoch_history.first().map_or(0, |r| r.epoch.0),
                self.map.epoch
            )));
        };
        let map = &self.epoch_history[at].map;
        if let Some(n) = map.nodes.values().find(|n| n.state != NodeState::Up) {
            return Err(invalid(format!(
                "Node {} was not up at epoch {keep_from}: the history before it is still needed",
                n.id
            )));
        }
        if at > 0 {
            let notes = Arc::make_mut(&mut self.trimmed_notes);
            notes.extend(self.epoch_history[..at].iter().map(EpochNote::from));
            let extra = notes.len().saturating_sub(MAX_TRIMMED_NOTES);
            notes.drain(..extra);
            Arc::make_mut(&mut self.epoch_history).drain(..at);
        }
        Ok(Reply::Done)
    }

    /// Every epoch change still known, oldest first: the notes of those trimmed
    /// from the history, then the history's.
    pub fn epoch_changes(&self) -> Vec<EpochNote> {
        self.trimmed_notes
            .iter()
            .cloned()
            .chain(self.epoch_history.iter().map(EpochNote::from))
            .collect()
    }

    fn upsert_node(&mut self, node: &NodeInfo, now: u64) {
        let id = node.id;
        let change = match self.map.nodes.get(&id) {
            None if node.witness => Some(format!("node {id} joined (zone {}, witness)", node.zone)),
            None => Some(format!(
                "node {id} joined (zone {}, weight {})",
                node.zone, node.weight
            )),
            Some(old) => {
                let mut parts = Vec::new();
                if old.zone != node.zone {
                    parts.push(format!("zone {} -> {}", old.zone, node.zone));
                }
                if old.witness != node.witness {
                    parts.push(format!("witness {} -> {}", old.witness, node.witness));
                }
                if old.weight != node.weight {
                    parts.push(format!("weight {} -> {}", old.weight, node.weight));
                }
                if old.state != node.state {
                    parts.push(format!("{:?} -> {:?}", old.state, node.state));
                }
                (!parts.is_empty()).then(|| format!("node {id} {}", parts.join(", ")))
            }
        };
        // Address-only updates (a restarted node on new ports) change no placement, so
        // they are stored without a new epoch.
        self.map.nodes.insert(id, node.clone());
        if let Some(change) = change {
            self.bump_epoch(now, change);
        }
    }

    fn set_node_state(
        &mut self,
        id: NodeId,
        state: NodeState,
        reason: &str,
        now: u64,
    ) -> Result<(), (ErrorKind, String)> {
        let Some(node) = self.map.nodes.get_mut(&id) else {
            return Err((ErrorKind::NotFound, format!("No node {id} in the cluster")));
        };
        if node.state != state {
            let mut change = format!("node {id} {:?} -> {:?}", node.state, state);
            if !reason.is_empty() {
                change.push_str(&format!(" ({reason})"));
            }
            node.state = state;
            self.bump_epoch(now, change);
        }
        if state == NodeState::Up {
            self.held_down.remove(&id);
        }
        Ok(())
    }

    /// Apply the failure detector's verdicts on several nodes in one epoch (none
    /// when no state changes); nothing when one of them is refused.
    pub(super) fn judge_nodes(
        &mut self,
        verdicts: &[(NodeId, NodeState)],
        now: u64,
    ) -> ApplyResult {
        if verdicts.is_empty() || verdicts.len() > MAX_VERDICTS {
            return Err(invalid(format!(
                "A batch of node verdicts holds {} verdicts: give 1 to {MAX_VERDICTS}",
                verdicts.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (id, _) in verdicts {
            if !seen.insert(*id) {
                return Err(invalid(format!("Node {id} is judged twice in one batch")));
            }
            if !self.map.nodes.contains_key(id) {
                return Err((ErrorKind::NotFound, format!("No node {id} in the cluster")));
            }
        }
        let mut changed = Vec::new();
        for &(id, state) in verdicts {
            let Some(node) = self.map.nodes.get_mut(&id) else {
                continue;
            };
            if node.state != state {
                changed.push(format!("node {id} {:?} -> {:?}", node.state, state));
                node.state = state;
            }
            if state == NodeState::Up {
                self.held_down.remove(&id);
            }
        }
        if !changed.is_empty() {
            let n = changed.len();
            let mut change: String = changed
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if n > 8 {
                change.push_str(&format!(" and {} more", n - 8));
            }
            change.push_str(" (by the failure detector)");
            self.bump_epoch(now, change);
        }
        Ok(Reply::Done)
    }

    pub(super) fn bump_epoch(&mut self, now: u64, change: String) {
        self.map.epoch = Epoch(self.map.epoch.0 + 1);
        Arc::make_mut(&mut self.epoch_history).push(EpochRecord {
            epoch: self.map.epoch,
            at_unix: now,
            change,
            map: self.map.clone(),
        });
    }
}

/// A node record must name an allocated id, a valid zone, a sane weight and
/// addresses of the form host:port.
pub(super) fn check_node(
    node: &NodeInfo,
    next_node_id: u64,
    removed: &std::collections::BTreeSet<NodeId>,
) -> Result<(), (ErrorKind, String)> {
    let id = node.id;
    if id.0 == 0 || id.0 >= next_node_id {
        return Err(invalid(format!("Node id {id} was never handed out")));
    }
    if removed.contains(&id) {
        return Err((
            ErrorKind::Gone,
            format!(
                "Node {id} was removed from the cluster; to bring this host back, empty its \
                 data directory and join it as a new node"
            ),
        ));
    }
    if validate_name(&node.zone).is_err() {
        return Err(invalid(format!(
            "Bad zone name '{}'",
            drove_types::shown(&node.zone)
        )));
    }
    if node.weight > MAX_WEIGHT {
        return Err(invalid(format!(
            "Bad weight {}: at most {MAX_WEIGHT}",
            node.weight
        )));
    }
    if node.witness && node.weight != 0 {
        return Err(invalid(format!(
            "Node {id} is a witness with weight {}: a witness holds no data (weight 0)",
            node.weight
        )));
    }
    if node.witness && !(node.nbd_addr.is_empty() && node.nbd_socket.is_empty()) {
        return Err(invalid(format!(
            "Node {id} is a witness with an NBD address: a witness serves no NBD"
        )));
    }
    let nbd = (!node.witness).then_some(("NBD", &node.nbd_addr));
    for (what, addr) in [("admin", &node.admin_addr), ("peer", &node.peer_addr)]
        .into_iter()
        .chain(nbd)
    {
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(format!("Bad {what} address '{addr}' of node {id}")));
        }
    }
    if node.nbd_socket.len() > 4096 {
        return Err(invalid(format!("NBD socket path of node {id} is too long")));
    }
    Ok(())
}

/// A node's build knows only `knows`, below the cluster's `level`.
pub(crate) fn too_old(id: NodeId, knows: u32, level: u32) -> (ErrorKind, String) {
    (
        ErrorKind::Invalid,
        format!(
            "Node {id} runs a build of cluster feature level {knows}, and the cluster is at \
             level {level} ({}): run a drove build of level {level} or newer on it",
            drove_types::feature_name(level)
        ),
    )
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}
