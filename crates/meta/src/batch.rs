//! Group commit on the leader. openraft 0.9 appends every proposal to the log on its
//! own and waits for that fsync before it does anything else, so proposals that come
//! one by one commit at one per fsync: with the disk busy with VM writes (a 300-byte
//! fsync took 0.5-1 s beside 32 writers here), 32 VDIs renewing their write locks
//! every 5 s fell behind without end, no lock renewal committed for 10 s and the VMs
//! got EIO. The batcher proposes one entry at a time; whatever arrives meanwhile goes
//! into the next entry as one [`Command::Batch`], so a busy moment costs one fsync
//! however many commands it brings. (Renewals are no longer commands at all; the
//! lease renewals the leader confirmed go ahead of each batch, see [`crate::lease`].)
use crate::lease::Leases;
use crate::remote::{Wire, Written};
use crate::state::{Command, Reply};
use crate::types::{Raft, Request, RequestId};
use drove_metrics::Metrics;
use drove_types::clock::Instant;
use openraft::error::{ClientWriteError, RaftError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Most commands in one entry (the state machine refuses longer batches), the lease
/// renewals written ahead of them included.
pub const MAX_BATCH: usize = 256;

/// How often the batcher looks for lease renewals to write down on their own.
const FLUSH_CHECK: Duration = Duration::from_millis(500);

type Job = (Request, oneshot::Sender<Wire<Written>>);

/// The queue in front of this node's Raft proposals.
pub(crate) struct Batcher {
    tx: mpsc::UnboundedSender<Job>,
}

/// The node's metrics, once the node has handed them over.
pub(crate) type MetricsCell = Arc<OnceLock<Arc<Metrics>>>;

impl Batcher {
    /// Start the proposing task; it ends when the batcher is dropped.
    pub(crate) fn new(
        raft: Raft,
        client: u64,
        metrics: MetricsCell,
        leases: Arc<Leases>,
    ) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, client, rx, metrics, leases));
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

/// Count one command's outcome, and the entry when it was proposed here.
fn record(metrics: &MetricsCell, kind: &str, answer: &Wire<Written>) {
    let Some(m) = metrics.get() else { return };
    let outcome = match answer {
        Wire::Ok(Written { result: Ok(_), .. }) => "ok",
        Wire::Ok(Written { result: Err(_), .. }) => "refused",
        Wire::Err { .. } => "failed",
        // Not proposed here: the leader counts it.
        Wire::NotLeader { .. } => return,
    };
    m.meta().command(kind, outcome);
}

async fn run(
    raft: Raft,
    client: u64,
    mut rx: mpsc::UnboundedReceiver<Job>,
    metrics: MetricsCell,
    leases: Arc<Leases>,
) {
    let mut seq = 0u64;
    let mut tick = tokio::time::interval(FLUSH_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            j = rx.recv() => match j {
                Some(j) => j,
                None => return,
            },
            _ = tick.tick() => {
                // Renewals confirmed a while ago and no command to carry them.
                if leases.flush_due() {
                    let p = leases.before(&[]);
                    let _ = propose_all(&raft, client, &mut seq, Vec::new(), p.extend.clone()).await;
                    leases.proposed(p);
                }
                continue;
            }
        };
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH - 1 {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let began = Instant::now();
        let n = jobs.len();
        let kinds: Vec<&'static str> = jobs.iter().map(|(r, _)| r.cmd.kind()).collect();
        let p = leases.before(jobs.iter().map(|(r, _)| r));
        let answers = propose_all(&raft, client, &mut seq, jobs, p.extend.clone()).await;
        leases.proposed(p);
        if let (Some(m), Some((_, first))) = (metrics.get(), answers.first()) {
            if !matches!(first, Wire::NotLeader { .. }) {
                m.meta().entry(began.elapsed().as_secs_f64(), n);
            }
        }
        for ((tx, answer), kind) in answers.into_iter().zip(kinds) {
            record(&metrics, kind, &answer);
            let _ = tx.send(answer);
        }
    }
}

type Answer = (oneshot::Sender<Wire<Written>>, Wire<Written>);

/// Propose the jobs as one entry (a batch when more than one, or when `first`, the
/// lease renewals to write down, goes ahead of them) and pair each waiter with its
/// answer.
async fn propose_all(
    raft: &Raft,
    client: u64,
    seq: &mut u64,
    mut jobs: Vec<Job>,
    first: Option<Command>,
) -> Vec<Answer> {
    if jobs.len() == 1 && first.is_none() {
        let (req, tx) = jobs.pop().expect("one job");
        return vec![(tx, propose(raft, req).await)];
    }
    let now = crate::meta::unix_now();
    let mut ahead = Vec::new();
    if let Some(cmd) = first {
        *seq += 1;
        ahead.push(Request {
            id: RequestId { client, seq: *seq },
            now,
            cmd,
        });
    }
    let skip = ahead.len();
    *seq += 1;
    let seq = *seq;
    let (reqs, txs): (Vec<Request>, Vec<_>) = jobs.into_iter().unzip();
    ahead.extend(reqs);
    let batch = Request {
        id: RequestId { client, seq },
        now,
        cmd: Command::Batch(ahead),
    };
    let n = txs.len();
    match propose(raft, batch).await {
        Wire::Ok(Written {
            result: Ok(Reply::Batch(results)),
            index,
        }) if results.len() == n + skip => txs
            .into_iter()
            .zip(results.into_iter().skip(skip))
            .map(|(tx, result)| (tx, Wire::Ok(Written { result, index })))
            .collect(),
        Wire::Ok(other) => {
            let why = format!("unexpected answer to a batch of {n}: {:?}", other.result);
            tracing::error!("{why}");
            txs.into_iter()
                .map(|tx| (tx, Wire::unavailable(why.clone())))
                .collect()
        }
        // Not the leader, no quorum, stopped: the same for every command.
        failed => txs.into_iter().map(|tx| (tx, failed.clone())).collect(),
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
