//! Forwarded writes, many to a request. A node that is not the leader sends its
//! metadata commands to the leader; one HTTP request each cost the leader more CPU
//! than the Raft work of the command itself (a write lock's acquire and release
//! through a follower: about 170 us of the leader's CPU per command, a third of it
//! in HTTP, measured with `drove bench meta` and perf). So, as the leader's batcher
//! does for log entries: up to [`IN_FLIGHT`] `POST /meta/write-batch` per leader are
//! on their way at a time, and the commands that arrive meanwhile go together in the
//! next, at most [`MAX_BATCH`] each. A command alone goes at once; batches form only
//! when the leader is slower than the commands come. (With one request in flight,
//! 32 creates at once through a follower went from 770/s to 460/s: each command
//! waited for the whole previous round trip.) Every command keeps its own request
//! id, so a batch sent again after a lost answer is applied once, command by
//! command, like single writes.
//!
//! A leader that does not know `/meta/write-batch` (an older version, during a
//! rolling upgrade) answers 404: the commands then go one by one to `/meta/write`.
use crate::batch::{MetricsCell, MAX_BATCH};
use crate::remote::{call, Client, NoAnswer, Wire, Written};
use crate::types::Request;
use drove_types::clock::Instant;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Requests on their way to one leader at a time.
const IN_FLIGHT: usize = 4;

/// A command that waited longer than this behind requests the leader has not
/// answered is not sent there: the caller is told it was not sent and asks again
/// (by then, perhaps, of a new leader), as it did when each command had a request of
/// its own. Longer than a batch takes on a slow metadata disk (fsyncs of 0.5-1.4 s
/// were seen beside the paper bench's VMs).
const QUEUE_PATIENCE: Duration = Duration::from_secs(3);

/// What a forwarded command got back: the leader's answer, or none.
pub(crate) type Forwarded = Result<Wire<Written>, NoAnswer>;

struct Job {
    addr: String,
    req: Request,
    tx: oneshot::Sender<Forwarded>,
    queued: Instant,
}

/// The queue of this node's forwarded writes.
pub(crate) struct Forwarder {
    tx: mpsc::UnboundedSender<Job>,
}

impl Forwarder {
    /// Start the sending task; it ends when the forwarder is dropped.
    pub(crate) fn new(client: Client, timeout: Duration, metrics: MetricsCell) -> Forwarder {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(client, timeout, rx, metrics));
        Forwarder { tx }
    }

    /// Send `req` to the leader at `addr` (the internal address), with whatever else
    /// is being forwarded there.
    pub(crate) async fn write(&self, addr: &str, req: &Request) -> Forwarded {
        let (tx, rx) = oneshot::channel();
        let stopped = || NoAnswer {
            why: "Metadata service stopped".into(),
            maybe_delivered: false,
            missing_route: false,
        };
        let job = Job {
            addr: addr.to_string(),
            req: req.clone(),
            tx,
            queued: Instant::now(),
        };
        if self.tx.send(job).is_err() {
            return Err(stopped());
        }
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

async fn run(
    client: Client,
    timeout: Duration,
    mut rx: mpsc::UnboundedReceiver<Job>,
    metrics: MetricsCell,
) {
    let mut queued: HashMap<String, Vec<Job>> = HashMap::new();
    let mut busy: HashMap<String, usize> = HashMap::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    loop {
        tokio::select! {
            job = rx.recv() => match job {
                Some(j) => queued.entry(j.addr.clone()).or_default().push(j),
                // Dropped: the callers of what is still queued get "stopped".
                None => return,
            },
            Some(addr) = done_rx.recv() => {
                if let Some(n) = busy.get_mut(&addr) {
                    *n = n.saturating_sub(1);
                }
            }
        }
        while let Ok(j) = rx.try_recv() {
            queued.entry(j.addr.clone()).or_default().push(j);
        }
        for (addr, jobs) in queued.iter_mut() {
            let sending = busy.entry(addr.clone()).or_default();
            // Unsent all along: the caller may ask again, elsewhere. (Looked at on
            // every event: a new command, a request answered.)
            for j in jobs.extract_if(.., |j| j.queued.elapsed() > QUEUE_PATIENCE) {
                let _ = j.tx.send(Err(NoAnswer {
                    why: format!(
                        "{addr}: not sent, earlier requests there unanswered for {} s",
                        QUEUE_PATIENCE.as_secs()
                    ),
                    maybe_delivered: false,
                    missing_route: false,
                }));
            }
            while !jobs.is_empty() && *sending < IN_FLIGHT {
                *sending += 1;
                let batch: Vec<Job> = jobs.drain(..jobs.len().min(MAX_BATCH)).collect();
                if let Some(m) = metrics.get() {
                    m.meta().forwarded(batch.len());
                }
                let (client, addr, done) = (client.clone(), addr.clone(), done_tx.clone());
                tokio::spawn(async move {
                    send(&client, &addr, batch, timeout).await;
                    let _ = done.send(addr);
                });
            }
        }
        queued.retain(|_, jobs| !jobs.is_empty());
        busy.retain(|_, n| *n > 0);
    }
}

/// Send `jobs` to the leader at `addr` and answer each.
async fn send(client: &Client, addr: &str, jobs: Vec<Job>, timeout: Duration) {
    if jobs.len() > 1 {
        let reqs: Vec<&Request> = jobs.iter().map(|j| &j.req).collect();
        match call::<_, Vec<Wire<Written>>>(client, addr, "/meta/write-batch", &reqs, timeout).await
        {
            Ok(Wire::Ok(answers)) if answers.len() == jobs.len() => {
                for (j, a) in jobs.into_iter().zip(answers) {
                    let _ = j.tx.send(Ok(a));
                }
                return;
            }
            Ok(Wire::Ok(answers)) => {
                let why = format!(
                    "{addr} answered {} of {} forwarded commands",
                    answers.len(),
                    jobs.len()
                );
                tracing::warn!("{why}");
                for j in jobs {
                    let _ = j.tx.send(Err(NoAnswer {
                        why: why.clone(),
                        maybe_delivered: true,
                        missing_route: false,
                    }));
                }
                return;
            }
            // About the whole batch: not the leader, refused, unavailable.
            Ok(Wire::Err { kind, msg }) => {
                for j in jobs {
                    let msg = msg.clone();
                    let _ = j.tx.send(Ok(Wire::Err { kind, msg }));
                }
                return;
            }
            Ok(Wire::NotLeader { leader }) => {
                for j in jobs {
                    let leader = leader.clone();
                    let _ = j.tx.send(Ok(Wire::NotLeader { leader }));
                }
                return;
            }
            Err(n) if n.missing_route => {
                tracing::debug!("{addr} has no /meta/write-batch: forwarding one by one");
            }
            Err(n) => {
                for j in jobs {
                    let _ = j.tx.send(Err(n.clone()));
                }
                return;
            }
        }
    }
    // One command, or a leader without batches: one request each, at once.
    let mut calls = tokio::task::JoinSet::new();
    for j in jobs {
        let (client, addr) = (client.clone(), addr.to_string());
        calls.spawn(async move {
            let a = call(&client, &addr, "/meta/write", &j.req, timeout).await;
            let _ = j.tx.send(a);
        });
    }
    while calls.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use crate::types::RequestId;
    use std::sync::Arc;

    fn req(seq: u64) -> Request {
        Request {
            id: RequestId { client: 5, seq },
            now: 0,
            cmd: Command::AllocateNodeId,
        }
    }

    /// A leader that takes requests and never answers (stopped, cut off): commands
    /// queued behind its unanswered requests are handed back unsent once they have
    /// waited `QUEUE_PATIENCE`, so their callers ask again elsewhere instead of
    /// sending them into the same silence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn test_commands_queued_behind_a_silent_leader_come_back_unsent() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let client = Client {
            net: crate::HttpNet::new(None, None).unwrap(),
            cluster: None,
        };
        let f = Arc::new(Forwarder::new(
            client,
            Duration::from_secs(60),
            MetricsCell::default(),
        ));
        // Four requests on their way, one command each.
        let mut hung = Vec::new();
        for seq in 1..=4 {
            let (f, addr) = (f.clone(), addr.clone());
            hung.push(tokio::spawn(async move { f.write(&addr, &req(seq)).await }));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The fifth waits for a free slot, which never comes.
        let t = Instant::now();
        let queued = {
            let (f, addr) = (f.clone(), addr.clone());
            tokio::spawn(async move { f.write(&addr, &req(5)).await })
        };
        tokio::time::sleep(QUEUE_PATIENCE + Duration::from_millis(300)).await;
        assert!(!queued.is_finished(), "answered before anything happened");
        // Any event (here a new command) hands it back, unsent.
        let sixth = {
            let (f, addr) = (f.clone(), addr.clone());
            tokio::spawn(async move { f.write(&addr, &req(6)).await })
        };
        let back = tokio::time::timeout(Duration::from_secs(5), queued)
            .await
            .expect("the queued command came back")
            .unwrap();
        let n = back.expect_err("no answer from a silent leader");
        assert!(!n.maybe_delivered, "{n:?}");
        assert!(n.why.contains("not sent"), "{n:?}");
        assert!(t.elapsed() < Duration::from_secs(10));
        // The new one waits its turn; the four sent ones are still unanswered.
        assert!(!sixth.is_finished());
        assert!(hung.iter().all(|h| !h.is_finished()));
    }
}
