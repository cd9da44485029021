//! Metadata (Raft) metrics: how long commits take, how many commands share an entry,
//! commands by kind and outcome (on the leader, which proposes them), and where this
//! node's Raft stands.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    kind: String,
    outcome: String,
}

/// The metadata metrics of one node.
pub struct MetaMetrics {
    commit: Histogram,
    batch: Histogram,
    forwarded: Histogram,
    commands: Family<CommandLabels, Counter>,
    applied: Gauge,
    term: Gauge,
    leader: Gauge,
    quorum: Gauge,
}

impl MetaMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = MetaMetrics {
            // 1 ms .. ~16 s.
            commit: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            // 1 .. 256 commands.
            batch: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            forwarded: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            commands: Family::default(),
            applied: Gauge::default(),
            term: Gauge::default(),
            leader: Gauge::default(),
            quorum: Gauge::default(),
        };
        reg.register(
            "meta_commit_seconds",
            "Time from proposing a log entry on the leader to its commit and apply there",
            m.commit.clone(),
        );
        reg.register(
            "meta_entry_commands",
            "Commands per log entry proposed on the leader (group commit)",
            m.batch.clone(),
        );
        reg.register(
            "meta_forward_commands",
            "Commands per request this node sent to the leader (forwarded writes \
             travel together while one request is on its way)",
            m.forwarded.clone(),
        );
        reg.register(
            "meta_commands",
            "Metadata commands proposed on this node as leader, by kind and outcome \
             (ok, refused by the state machine, failed: not committed)",
            m.commands.clone(),
        );
        reg.register(
            "meta_applied_index",
            "Index of the last Raft log entry applied on this node",
            m.applied.clone(),
        );
        reg.register("meta_term", "This node's Raft term", m.term.clone());
        reg.register(
            "meta_leader",
            "The metadata leader's node id as this node knows it (0: none)",
            m.leader.clone(),
        );
        reg.register(
            "meta_quorum",
            "1 when this node knows of a metadata majority: as leader, one acknowledged \
             it within the last 3 s; otherwise the leader said so within the last 3 s",
            m.quorum.clone(),
        );
        m
    }

    /// One log entry of `commands` commands committed (or failed) after `secs`.
    pub fn entry(&self, secs: f64, commands: usize) {
        self.commit.observe(secs);
        self.batch.observe(commands as f64);
    }

    /// One request carrying `commands` forwarded commands sent to the leader.
    pub fn forwarded(&self, commands: usize) {
        self.forwarded.observe(commands as f64);
    }

    /// One command of `kind` ended with `outcome` (`ok`, `refused`, `failed`).
    pub fn command(&self, kind: &str, outcome: &str) {
        self.commands
            .get_or_create(&CommandLabels {
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Where this node's Raft stands.
    pub fn raft(&self, applied: u64, term: u64, leader: u64, quorum: bool) {
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.applied.set(g(applied));
        self.term.set(g(term));
        self.leader.set(g(leader));
        self.quorum.set(i64::from(quorum));
    }
}
