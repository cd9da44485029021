//! Linearizable metadata writes: [`Meta::execute`] proposes a command through Raft on
//! the leader, forwarding it over HTTP when this node is not the leader, and retrying
//! (same request id, so at most one apply) while there is no leader. A command that
//! was proposed (or sent to a leader) and got no answer before the deadline fails with
//! `OutcomeUnknown`, not `Unavailable`: it may still be applied.
//!
//! A write follows a change of leader at once: the wait between two tries ends as
//! soon as this node follows a new leader, and a write forwarded to a leader that
//! went silent (SIGSTOP, a cut cable) is sent again to the next one as soon as it is
//! known, instead of waiting out [`FORWARD_TIMEOUT`]. Sending it again is safe: it
//! keeps its request id, so it is applied at most once.
use crate::meta::{unix_now, Meta, ToLeader};
use crate::remote::{retry_waking, Attempt, Wire, Written};
use crate::state::{Command, Reply};
use crate::types::Request;
use drove_types::clock::Instant;
use drove_types::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long `execute` keeps trying to find a leader.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Timeout of one forwarded write, as seen by the caller.
pub(crate) const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the leader works on a forwarded write: less than [`FORWARD_TIMEOUT`] so
/// the caller gets a clear answer rather than a transport timeout.
pub(crate) const SERVE_TIMEOUT: Duration = Duration::from_secs(4);

/// Shortest time given to one local attempt, even at the deadline.
const MIN_TRY: Duration = Duration::from_millis(100);

impl Meta {
    /// Apply `cmd` through Raft and return its result once it is committed and applied
    /// on this node (so [`Meta::state`] reflects it). Without a leader for about 10 s
    /// the error is `Unavailable` "No metadata leader", or `OutcomeUnknown` when the
    /// command was proposed and may still be applied; a command the state machine
    /// refuses returns its own error (`AlreadyExists`, `NotFound`, `Invalid`, ...).
    /// Under a client request ([`crate::with_client_request`]) the command's request
    /// id comes from the client's, so the client's retry is applied at most once.
    pub async fn execute(&self, cmd: Command) -> Result<Reply> {
        // A command of a feature level above the cluster's is refused here, before
        // any node of an older build is sent a log entry it cannot read (the state
        // machine refuses it too, but that is once every member has it in its log).
        // This node's state may lag the leader's; the level only ever rises, so a
        // lag refuses too much, never too little.
        self.state()
            .check_feature_level(&cmd)
            .map_err(|(kind, msg)| Error::new(kind, msg))?;
        if let Command::FinishUpgrade { level } = &cmd {
            self.members_know(*level)?;
        }
        let deadline = Instant::now() + WRITE_TIMEOUT;
        let req = Request {
            id: crate::client_req::next().unwrap_or_else(|| self.next_request_id()),
            now: unix_now(),
            cmd,
        };
        let proposed = AtomicBool::new(false);
        // The leader this node followed when the last try began.
        let seen = Mutex::new(None);
        let written = retry_waking(
            deadline,
            "No metadata leader",
            |hint| self.write_once(&req, hint, deadline, &proposed, &seen),
            || self.leader_moved(*seen.lock(), None),
        )
        .await
        .map_err(|e| {
            if e.kind() == ErrorKind::Unavailable && proposed.load(Ordering::Relaxed) {
                Error::new(
                    ErrorKind::OutcomeUnknown,
                    format!(
                        "{}; the command was proposed and may still be applied once a \
                         metadata majority answers",
                        e.message()
                    ),
                )
            } else {
                e
            }
        })?;
        // Read-your-writes on this node: wait for the local state machine to catch up
        // with the entry. The write is committed either way.
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(500));
        if let Err(e) = self
            .raft
            .wait(Some(left))
            .applied_index_at_least(Some(written.index), "metadata write applied locally")
            .await
        {
            tracing::warn!(
                index = written.index,
                "committed write not yet applied here: {e}"
            );
        }
        written.result.map_err(|(kind, msg)| Error::new(kind, msg))
    }

    async fn write_once(
        &self,
        req: &Request,
        hint: Option<String>,
        deadline: Instant,
        proposed: &AtomicBool,
        seen: &Mutex<Option<u64>>,
    ) -> Attempt<Written> {
        let followed = self.raft.metrics().borrow().current_leader;
        *seen.lock() = followed;
        let addr = match self.to_leader(hint) {
            ToLeader::Closed => {
                return Attempt::Fail(Error::unavailable("Metadata service stopped"))
            }
            ToLeader::Unknown => return ToLeader::no_leader(),
            ToLeader::There(addr) => addr,
            ToLeader::Here => {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(MIN_TRY);
                let w = self.local_write_within(req.clone(), left).await;
                if is_unavailable(&w) || matches!(w, Wire::NotLeader { .. }) {
                    // Proposed here and not committed in time, or this node stopped
                    // leading meanwhile (openraft then answers "forward to the leader"
                    // for entries the next leader may still commit): it may commit later.
                    proposed.store(true, Ordering::Relaxed);
                }
                return w.into();
            }
        };
        let answer = tokio::select! {
            a = self.forward.write(&addr, req) => a,
            _ = self.leader_moved(followed, Some(&addr)) => {
                // Sent, maybe delivered, and no answer yet: the old leader may still
                // have it in its log, so the next leader may commit it.
                proposed.store(true, Ordering::Relaxed);
                return Attempt::Retry {
                    hint: None,
                    why: format!("{addr} stopped leading before it answered"),
                };
            }
        };
        match answer {
            Ok(w) => {
                if is_unavailable(&w) {
                    proposed.store(true, Ordering::Relaxed);
                }
                w.into()
            }
            Err(n) => {
                if n.maybe_delivered {
                    proposed.store(true, Ordering::Relaxed);
                }
                Attempt::Retry {
                    hint: None,
                    why: n.why,
                }
            }
        }
    }

    /// Resolves once this node follows a leader other than `from` (by id) whose
    /// address is not `not_addr`; never while it follows `from` or no leader.
    pub(crate) async fn leader_moved(&self, from: Option<u64>, not_addr: Option<&str>) {
        let mut rx = self.raft.metrics();
        loop {
            let now = rx.borrow_and_update().current_leader;
            if let Some(id) = now.filter(|&id| Some(id) != from) {
                let addr = self.raft_addr(id);
                if addr.is_some() && addr.as_deref() != not_addr {
                    return;
                }
            }
            if rx.changed().await.is_err() {
                // Raft stopped: nothing will move any more.
                std::future::pending::<()>().await;
            }
        }
    }

    /// [`Meta::local_write`], giving up after `limit`: a leader that lost its quorum
    /// keeps the proposal pending forever. The entry may still commit later; a retry
    /// with the same request id is then answered from the deduplication window.
    pub(crate) async fn local_write_within(&self, req: Request, limit: Duration) -> Wire<Written> {
        match tokio::time::timeout(limit, self.local_write(req)).await {
            Ok(w) => w,
            Err(_) => Wire::unavailable(format!(
                "write not committed within {} ms (no quorum?)",
                limit.as_millis()
            )),
        }
    }

    /// Propose on this node's Raft, in one entry with whatever else is proposed
    /// meanwhile; answers `NotLeader` unless it is the leader.
    async fn local_write(&self, req: Request) -> Wire<Written> {
        self.batch.write(req).await
    }
}

/// A "try again" answer from a node that may have proposed the command.
fn is_unavailable(w: &Wire<Written>) -> bool {
    matches!(
        w,
        Wire::Err {
            kind: ErrorKind::Unavailable,
            ..
        }
    )
}
