//! Group commit on the leader. openraft 0.9 appends every proposal to the log on its
//! own and waits for that fsync before it does anything else, so proposals that come
//! one by one commit at one per fsync: with the disk busy with VM writes (a 300-byte
//! fsync took 0.5-1 s beside 32 writers here), 32 VDIs renewing their write locks
//! every 5 s fell behind without end, no lock renewal committed for 10 s and the VMs
//! got EIO. The batcher proposes one entry at a time; whatever arrives meanwhile goes
//! into the next entry as one [`Command::Batch`], so a busy moment costs one fsync
//! however many commands it brings.
use crate::remote::{Wire, Written};
use crate::state::{Command, Reply};
use crate::types::{Raft, Request, RequestId};
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot};

/// Most commands in one entry (the state machine refuses longer batches).
pub const MAX_BATCH: usize = 256;

type Job = (Request, oneshot::Sender<Wire<Written>>);

/// The queue in front of this node's Raft proposals.
pub(crate) struct Batcher {
    tx: mpsc::UnboundedSender<Job>,
}

impl Batcher {
    /// Start the proposing task; it ends when the batcher is dropped.
    pub(crate) fn new(raft: Raft, client: u64) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, client, rx));
        Batcher { tx }
    }

    /// Propose `req` (with the commands queued beside it); answers `NotLeader` unless
    /// this node is the leader.
    pub(crate) async fn write(&self, req: Request) -> Wire<Written> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((req, tx)).is_err() {
            return Wire::unavailable("Metadata service stopped");
        }
        rx.await
            .unwrap_or_else(|_| Wire::unavailable("Metadata service stopped"))
    }
}

async fn run(raft: Raft, client: u64, mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut seq = 0u64;
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        if jobs.len() == 1 {
            let (req, tx) = jobs.pop().expect("one job");
            let _ = tx.send(propose(&raft, req).await);
            continue;
        }
        seq += 1;
        let (reqs, txs): (Vec<Request>, Vec<_>) = jobs.into_iter().unzip();
        let batch = Request {
            id: RequestId { client, seq },
            now: crate::meta::unix_now(),
            cmd: Command::Batch(reqs),
        };
        let n = txs.len();
        match propose(&raft, batch).await {
            Wire::Ok(Written {
                result: Ok(Reply::Batch(results)),
                index,
            }) if results.len() == n => {
                for (tx, result) in txs.into_iter().zip(results) {
                    let _ = tx.send(Wire::Ok(Written { result, index }));
                }
            }
            Wire::Ok(other) => {
                let why = format!("unexpected answer to a batch of {n}: {:?}", other.result);
                tracing::error!("{why}");
                for tx in txs {
                    let _ = tx.send(Wire::unavailable(why.clone()));
                }
            }
            // Not the leader, no quorum, stopped: the same for every command.
            failed => {
                for tx in txs {
                    let _ = tx.send(failed.clone());
                }
            }
        }
    }
}

/// Propose on this node's Raft; answers `NotLeader` unless it is the leader.
async fn propose(raft: &Raft, req: Request) -> Wire<Written> {
    match raft.client_write(req).await {
        Ok(resp) => Wire::Ok(Written {
            result: resp.data,
            index: resp.log_id.index,
        }),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Wire::NotLeader {
            leader: f.leader_node.map(|n| n.addr),
        },
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
            Wire::unavailable(e.to_string())
        }
        Err(RaftError::Fatal(e)) => Wire::unavailable(format!("Metadata Raft stopped: {e}")),
    }
}
