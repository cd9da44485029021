//! The receiving side of the metadata's internal calls ([`crate::net`]): one
//! function, [`Meta::serve`], that every carrier hands a call to (the HTTP router
//! of the peer port in production, the simulated network in crates/sim). Raft RPCs
//! under `/raft/` are answered by the local Raft whatever its role; calls under
//! `/meta/` only by the leader (others answer [`Wire::NotLeader`]). Every call is
//! treated as hostile: the cluster id of every call but the hello, Raft terms,
//! indexes and sizes in [`crate::raft_checks`], batch lengths, and what only the
//! leader may propose are checked before anything acts on it.
use crate::meta::Meta;
use crate::net::{Method, NetAnswer};
use crate::raft_checks;
use crate::remote::{Hello, JoinRequest, Wire, Written};
use crate::types::{Request, TypeConfig};
use crate::write::SERVE_TIMEOUT;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;

/// Largest body of a call: a batch of log entries or a snapshot chunk, JSON encoded.
pub const BODY_LIMIT: usize = 64 << 20;

fn json<T: Serialize>(status: u16, v: &T) -> NetAnswer {
    match serde_json::to_vec(v) {
        Ok(body) => NetAnswer { status, body },
        Err(e) => NetAnswer {
            status: 500,
            body: format!("cannot encode the answer: {e}").into_bytes(),
        },
    }
}

fn ok<T: Serialize>(v: &T) -> NetAnswer {
    json(200, v)
}

/// A call refused before anything acted on it: a 400 with the reason.
fn refused(what: &str, why: String) -> NetAnswer {
    tracing::warn!("refused a {what}: {why}");
    NetAnswer {
        status: 400,
        body: format!("Refused {what}: {why}").into_bytes(),
    }
}

fn decode<T: DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, NetAnswer> {
    serde_json::from_slice(body).map_err(|e| refused(what, format!("bad JSON body: {e}")))
}

impl Meta {
    /// Answer the internal call `path` (`method`) whose sender named cluster
    /// `cluster` (the hex of the cluster header), with JSON body `body`.
    pub async fn serve(
        self: &Arc<Self>,
        method: Method,
        path: &str,
        cluster: Option<&str>,
        body: &[u8],
    ) -> NetAnswer {
        if method == Method::Get && path == "/meta/hello" {
            return ok(&Hello {
                cluster: self.cluster,
                node: self.id,
                internal: Some(self.cfg.addr.clone()),
            });
        }
        // A node left running from another cluster (whose ports were reused) must
        // not vote, append, write metadata or send heartbeats here.
        let theirs = cluster.and_then(drove_types::ClusterId::from_hex);
        if theirs != Some(self.cluster) {
            let named = cluster.unwrap_or("none");
            tracing::warn!(%path, cluster = %named, "refused an internal call from another cluster");
            let msg = format!(
                "Refused: the call names cluster {named}, this node belongs to cluster {}",
                self.cluster
            );
            return json(
                403,
                &Wire::<()>::Err {
                    kind: drove_types::ErrorKind::Invalid,
                    msg,
                },
            );
        }
        if body.len() > BODY_LIMIT {
            return refused(path, format!("a body of {} bytes", body.len()));
        }
        let res = match (method, path) {
            (Method::Post, "/raft/append") => self.serve_append(body).await,
            (Method::Post, "/raft/vote") => self.serve_vote(body).await,
            (Method::Post, "/raft/snapshot") => self.serve_snapshot(body).await,
            (Method::Post, "/meta/write") => self.serve_write(body).await,
            (Method::Post, "/meta/write-batch") => self.serve_write_batch(body).await,
            (Method::Post, "/meta/read-index") => self.serve_read_index().await,
            (Method::Post, "/meta/renew") => self.serve_renew(body).await,
            (Method::Post, "/meta/join") => self.serve_join(body).await,
            (Method::Post, "/meta/remove") => self.serve_remove(body).await,
            (Method::Post, "/meta/heartbeat") => self.serve_heartbeat(body),
            _ => Err(NetAnswer {
                status: 404,
                body: format!("No internal route {path}").into_bytes(),
            }),
        };
        res.unwrap_or_else(|a| a)
    }

    /// This node's side of the Raft RPC checks.
    fn own(&self) -> raft_checks::Own {
        raft_checks::Own {
            term: self.raft.metrics().borrow().current_term,
        }
    }

    async fn serve_append(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let req: AppendEntriesRequest<TypeConfig> = decode("Raft append", body)?;
        raft_checks::append(&req, self.own()).map_err(|why| refused("Raft append", why))?;
        let res: Result<AppendEntriesResponse<u64>, RaftError<u64>> =
            self.raft.append_entries(req).await;
        Ok(ok(&res))
    }

    async fn serve_vote(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let req: VoteRequest<u64> = decode("Raft vote", body)?;
        raft_checks::vote(&req, self.own()).map_err(|why| refused("Raft vote", why))?;
        let res: Result<VoteResponse<u64>, RaftError<u64>> = self.raft.vote(req).await;
        Ok(ok(&res))
    }

    async fn serve_snapshot(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let req: InstallSnapshotRequest<TypeConfig> = decode("Raft snapshot", body)?;
        raft_checks::snapshot(&req, self.own()).map_err(|why| refused("Raft snapshot", why))?;
        let res: Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> =
            self.raft.install_snapshot(req).await;
        Ok(ok(&res))
    }

    async fn serve_write(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let req: Request = decode("forwarded write", body)?;
        if self.is_closed() {
            return Ok(ok(&Wire::<Written>::unavailable(
                "Metadata service stopped",
            )));
        }
        Ok(ok(&self.write_one(req).await))
    }

    /// `/meta/write-batch`: several forwarded commands (see [`crate::forward`]),
    /// each proposed and answered as by `/meta/write`, in order.
    async fn serve_write_batch(self: &Arc<Self>, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let reqs: Vec<Request> = decode("forwarded batch", body)?;
        if self.is_closed() {
            return Ok(ok(&Wire::<Vec<Wire<Written>>>::unavailable(
                "Metadata service stopped",
            )));
        }
        if reqs.is_empty() || reqs.len() > crate::batch::MAX_BATCH {
            tracing::warn!(
                commands = reqs.len(),
                "refused a forwarded batch of a bad length"
            );
            return Ok(ok(&Wire::<Vec<Wire<Written>>>::Err {
                kind: drove_types::ErrorKind::Invalid,
                msg: format!(
                    "A forwarded batch of {} commands (1 to {})",
                    reqs.len(),
                    crate::batch::MAX_BATCH
                ),
            }));
        }
        let mut calls = tokio::task::JoinSet::new();
        for (i, req) in reqs.into_iter().enumerate() {
            let meta = self.clone();
            calls.spawn(async move { (i, meta.write_one(req).await) });
        }
        let mut answers: Vec<Option<Wire<Written>>> = vec![None; calls.len()];
        while let Some(done) = calls.join_next().await {
            if let Ok((i, a)) = done {
                answers[i] = Some(a);
            }
        }
        Ok(ok(&Wire::Ok(
            answers
                .into_iter()
                .map(|a| a.unwrap_or_else(|| Wire::unavailable("the write's task failed")))
                .collect::<Vec<_>>(),
        )))
    }

    /// One forwarded command, checked and proposed on this node's Raft.
    async fn write_one(&self, req: Request) -> Wire<Written> {
        // The time in the log is the leader's, not the sender's: a sender cannot
        // date a lease or a verdict as it likes.
        let req = Request {
            now: crate::meta::unix_now(),
            ..req
        };
        // A history trim rests on what the leader heard from every node's
        // heartbeats: a node that sends one would make the others forget maps
        // recovery may need.
        if matches!(
            req.cmd,
            crate::state::Command::Batch(_)
                | crate::state::Command::ExtendLeases { .. }
                | crate::state::Command::TrimHistory { .. }
        ) {
            tracing::warn!(
                kind = req.cmd.kind(),
                "refused a command from the network that only the leader makes"
            );
            return Wire::Err {
                kind: drove_types::ErrorKind::Invalid,
                msg: format!("{} is made by the leader, not sent to it", req.cmd.kind()),
            };
        }
        // A command of a level above the cluster's, or a level raised while a member
        // does not know it, is refused before it is proposed: once in the log, a
        // member of an older build could not read it (the sender should have checked;
        // a message from the network is not trusted to have).
        let level_ok = self
            .state()
            .check_feature_level(&req.cmd)
            .map_err(|(kind, msg)| drove_types::Error::new(kind, msg))
            .and_then(|()| match &req.cmd {
                crate::state::Command::FinishUpgrade { level } => self.members_know(*level),
                _ => Ok(()),
            });
        if let Err(e) = level_ok {
            tracing::warn!(kind = req.cmd.kind(), "refused a forwarded command: {e}");
            return Wire::Err {
                kind: e.kind(),
                msg: e.message().to_string(),
            };
        }
        self.local_write_within(req, SERVE_TIMEOUT).await
    }

    async fn serve_read_index(&self) -> Result<NetAnswer, NetAnswer> {
        if self.is_closed() {
            return Ok(ok(&Wire::<Option<u64>>::unavailable(
                "Metadata service stopped",
            )));
        }
        Ok(ok(&self.local_read_index().await))
    }

    async fn serve_renew(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let r: crate::Renew = decode("lease renewal", body)?;
        if self.is_closed() {
            return Ok(ok(&Wire::<crate::VdiLock>::unavailable(
                "Metadata service stopped",
            )));
        }
        Ok(ok(&self.local_renew(&r).await))
    }

    async fn serve_join(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let req: JoinRequest = decode("join", body)?;
        Ok(ok(&self.handle_join(req).await))
    }

    async fn serve_remove(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let id: u64 = decode("removal", body)?;
        Ok(ok(&self.handle_remove(id).await))
    }

    fn serve_heartbeat(&self, body: &[u8]) -> Result<NetAnswer, NetAnswer> {
        let hb: crate::Heartbeat = decode("heartbeat", body)?;
        Ok(ok(&self.receive_heartbeat(hb)))
    }
}
