//! Linearizable reads without a log entry (Raft's read-index): before reading its
//! own applied state, a node asks the leader for the index it must have applied
//! (`POST /meta/read-index`; the leader first confirms with a heartbeat round that a
//! majority still follows it, openraft's `get_read_log_id`), then waits until it has
//! applied that far. A read so served sees every write that completed before it
//! began, on whichever node, and costs one round trip to the leader and one from the
//! leader to a majority, never an fsync.
use crate::meta::{Meta, ToLeader};
use crate::remote::{post, retry, Attempt, Wire};
use drove_types::clock::Instant;
use drove_types::{Error, Result};
use std::time::Duration;

/// How long the leader is given to confirm its leadership for one read.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

impl Meta {
    /// Wait until this node's state ([`Meta::state`]) holds every write committed
    /// before the call, or fail (`Unavailable`) within `limit` when that cannot be
    /// confirmed (no leader, no majority).
    pub async fn read_barrier(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let index = retry(deadline, "Cannot confirm a current view", |hint| {
            self.read_index_once(hint, deadline)
        })
        .await?;
        let Some(index) = index else { return Ok(()) };
        let left = deadline.saturating_duration_since(Instant::now());
        self.raft
            .wait(Some(left.max(Duration::from_millis(100))))
            .applied_index_at_least(Some(index), "read barrier")
            .await
            .map(|_| ())
            .map_err(|e| {
                Error::unavailable(format!(
                    "This node has not applied the metadata up to index {index} in time: {e}"
                ))
            })
    }

    async fn read_index_once(
        &self,
        hint: Option<String>,
        deadline: Instant,
    ) -> Attempt<Option<u64>> {
        let addr = match self.to_leader(hint) {
            ToLeader::Closed => {
                return Attempt::Fail(Error::unavailable("Metadata service stopped"))
            }
            ToLeader::Unknown => return ToLeader::no_leader(),
            ToLeader::Here => return self.local_read_index().await.into(),
            ToLeader::There(addr) => addr,
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        post(&self.client, &addr, "/meta/read-index", &(), left).await
    }

    /// On the leader: the index a read must wait for, once a majority confirmed
    /// this node still leads.
    pub(crate) async fn local_read_index(&self) -> Wire<Option<u64>> {
        match tokio::time::timeout(CONFIRM_TIMEOUT, self.raft.get_read_log_id()).await {
            Ok(Ok((read, _))) => Wire::Ok(read.map(|l| l.index)),
            Ok(Err(openraft::error::RaftError::APIError(
                openraft::error::CheckIsLeaderError::ForwardToLeader(f),
            ))) => Wire::NotLeader {
                leader: f.leader_node.map(|n| n.addr),
            },
            Ok(Err(e)) => Wire::unavailable(format!("Cannot confirm the leadership: {e}")),
            Err(_) => Wire::unavailable(format!(
                "a majority did not confirm the leader within {} s (no quorum?)",
                CONFIRM_TIMEOUT.as_secs()
            )),
        }
    }
}
