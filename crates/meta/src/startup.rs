//! How a node becomes a working member, in the background after [`Meta::open`]:
//! bootstrap (node 1 with no join address initializes a one-voter cluster), join
//! (ask the leader to add us as learner, then voter while there is room), and
//! finally record our addresses in the map with `UpsertNode`. Every step is
//! idempotent and retried with backoff until it succeeds, because after a full
//! cluster restart nodes come up in any order and must wait for each other.
use crate::meta::{unix_now, Meta};
use crate::net::Method;
use crate::remote::{post, retry, retry_with, Attempt, JoinRequest, Role, Written};
use crate::state::{Command, Reply};
use crate::types::{Request, RequestId};
use drove_types::clock::Instant;
use drove_types::{Error, NodeId, NodeInfo, Result};
use openraft::error::{InitializeError, RaftError};
use openraft::BasicNode;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Where the background startup stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Not there yet, and why.
    Pending(String),
    /// Member with a leader, own addresses recorded.
    Ready,
    /// Shut down before getting ready.
    Stopped,
    /// Can never get ready (this node was removed from the cluster), and why.
    Failed(String),
}

/// How long one join attempt keeps looking for the leader.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Timeout of one join call: the leader waits for us to catch up before promoting.
const JOIN_CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Largest pause between startup attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How often a node that cannot reach its join address says so.
const JOIN_REPORT_EVERY: Duration = Duration::from_secs(5);

/// Ask the member at `join` which cluster it belongs to (`GET /meta/hello`). While
/// nothing answers there (refused, unreachable, silent: a member may be starting or
/// restarting), retry until `deadline`, saying so every few seconds. Anything that
/// answers but not as a drove node's admin API does (not HTTP, another HTTP
/// service, a drove peer or NBD port) fails at once: waiting cannot fix it.
pub(crate) async fn ask_cluster_id(
    client: &crate::remote::Client,
    join: &str,
    deadline: Instant,
) -> Result<crate::remote::Hello> {
    // The admin API speaks HTTPS when the nodes have certificates (then the
    // client has them too: the scheme of its internal calls).
    let url = client.url(join, "/meta/hello");
    let what = format!("Cannot learn the cluster id from {join}");
    let not_drove = |why: String| {
        Attempt::Fail(Error::invalid(format!(
            "{join} is not the admin address of a drove node ({why}); \
             --join takes a member's admin address (its --listen)"
        )))
    };
    tracing::info!(join, "asking {join} which cluster it belongs to");
    retry_with(deadline, &what, Some(JOIN_REPORT_EVERY), |_| {
        let url = &url;
        let not_drove = &not_drove;
        async move {
            let resp = match client
                .send(
                    join,
                    Method::Get,
                    "/meta/hello",
                    Vec::new(),
                    crate::write::FORWARD_TIMEOUT,
                )
                .await
            {
                Ok(r) => r,
                // Nothing there yet, or not answering yet: worth waiting for.
                Err(e) if e.is_silence() => {
                    return Attempt::Retry {
                        hint: None,
                        why: e.why().to_string(),
                    }
                }
                // Connected, but no HTTP answer came back.
                Err(e) => return not_drove(e.why().to_string()),
            };
            let status = resp.status;
            if status >= 500 {
                // A drove node answers 5xx only while it cannot serve yet.
                return Attempt::Retry {
                    hint: None,
                    why: format!("{url} answered HTTP {status}"),
                };
            }
            if !resp.is_success() {
                return not_drove(format!("{url} answered HTTP {status}"));
            }
            match serde_json::from_slice::<crate::remote::Hello>(&resp.body) {
                Ok(h) => Attempt::Done(h),
                Err(e) => not_drove(format!("{url} answered something else: {e}")),
            }
        }
    })
    .await
}

/// Ask the cluster at `join` (any member; it points us to the leader) for a node id.
pub(crate) async fn allocate_node_id(
    client: &crate::remote::Client,
    join: &str,
    client_id: u64,
    deadline: Instant,
) -> Result<u64> {
    let req = Request {
        id: RequestId {
            client: client_id,
            seq: 0,
        },
        now: unix_now(),
        cmd: Command::AllocateNodeId,
    };
    tracing::info!(join, "asking the metadata cluster for a node id");
    let what = format!("Cannot get a node id from {join}");
    let written: Written = retry_with(deadline, &what, Some(JOIN_REPORT_EVERY), |hint| {
        let addr = hint.unwrap_or_else(|| join.to_string());
        let req = &req;
        async move {
            post(
                client,
                &addr,
                "/meta/write",
                req,
                crate::write::FORWARD_TIMEOUT,
            )
            .await
        }
    })
    .await?;
    match written.result {
        Ok(Reply::NodeId(NodeId(id))) => Ok(id),
        Ok(other) => Err(Error::invalid(format!(
            "Unexpected answer to a node id request: {other:?}"
        ))),
        Err((kind, msg)) => Err(Error::new(kind, msg)),
    }
}

impl Meta {
    /// Retry [`Meta::startup_once`] until it succeeds or the node shuts down.
    pub(crate) async fn run_startup(self: Arc<Self>) {
        let mut delay = Duration::from_millis(200);
        let mut tries = 0u32;
        loop {
            match self.startup_once().await {
                Ok(()) => {
                    tracing::info!(node = self.id, "metadata service ready");
                    self.progress.send_replace(Progress::Ready);
                    return;
                }
                Err(e) => {
                    if self.is_closed() {
                        return;
                    }
                    if e.kind() == drove_types::ErrorKind::Gone {
                        tracing::error!(node = self.id, "{e}");
                        self.progress.send_replace(Progress::Failed(e.to_string()));
                        return;
                    }
                    tries += 1;
                    tracing::warn!(node = self.id, tries, "metadata not ready yet: {e}");
                    self.progress.send_replace(Progress::Pending(e.to_string()));
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    async fn startup_once(&self) -> Result<()> {
        if self.id == 1 && self.cfg.join.is_none() {
            self.bootstrap().await?;
        }
        if !self.is_voter_here() {
            self.progress.send_replace(Progress::Pending(
                "joining the metadata cluster".to_string(),
            ));
            let role = self.join().await?;
            tracing::info!(node = self.id, ?role, "member of the metadata cluster");
        }
        self.progress.send_replace(Progress::Pending(
            "recording this node in the map".to_string(),
        ));
        let node = NodeInfo {
            id: NodeId(self.id),
            ..self.cfg.node.clone()
        };
        self.execute(Command::UpsertNode(node)).await?;
        // Locks an earlier run of this node held die with it: another node may take
        // them (and repair first) without waiting out their leases.
        self.execute(Command::ForgetRun {
            node: NodeId(self.id),
            incarnation: self.incarnation(),
        })
        .await?;
        Ok(())
    }

    /// Make this node the single voter of a new cluster, unless already done (a
    /// restart after bootstrap finds its membership in the log).
    async fn bootstrap(&self) -> Result<()> {
        let stopped =
            |e: &dyn std::fmt::Display| Error::unavailable(format!("Metadata Raft stopped: {e}"));
        if self.raft.is_initialized().await.map_err(|e| stopped(&e))? {
            return Ok(());
        }
        tracing::info!(node = self.id, addr = %self.cfg.addr, "bootstrapping a one-voter metadata cluster");
        let members = BTreeMap::from([(
            self.id,
            BasicNode {
                addr: self.cfg.addr.clone(),
            },
        )]);
        match self.raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
            Err(e) => {
                return Err(Error::unavailable(format!(
                    "Cannot bootstrap the metadata cluster: {e}"
                )))
            }
        }
        // The membership shows up in the metrics a moment later; wait for it so the
        // join step sees this node as a voter already.
        let id = self.id;
        self.raft
            .wait(Some(Duration::from_secs(5)))
            .metrics(
                move |m| {
                    m.membership_config
                        .membership()
                        .voter_ids()
                        .any(|v| v == id)
                },
                "bootstrap membership visible",
            )
            .await
            .map_err(|e| Error::unavailable(format!("Bootstrap membership not visible: {e}")))?;
        Ok(())
    }

    /// Ask the leader (found through our own view, the hints, or the join address) to
    /// add us, or to update our address after a restart on new ports.
    async fn join(&self) -> Result<Role> {
        let req = JoinRequest {
            id: self.id,
            addr: self.cfg.addr.clone(),
            max_voters: self.cfg.max_voters,
            features: self.cfg.node.feature_level(),
        };
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut turn = 0usize;
        retry(deadline, "Cannot join the metadata cluster", |hint| {
            // Without a known leader (say we restarted on a new port, so the leader
            // cannot reach us), ask the join address and the members we know in turn;
            // any of them points us to the leader.
            let target = hint
                .or_else(|| self.leader().map(|(_, addr)| addr))
                .or_else(|| {
                    let contacts = self.contact_points();
                    turn += 1;
                    contacts.get(turn % contacts.len().max(1)).cloned()
                });
            let req = &req;
            async move {
                if self.is_closed() {
                    return Attempt::Fail(Error::unavailable("Metadata service stopped"));
                }
                match target {
                    Some(addr) => {
                        post(&self.client, &addr, "/meta/join", req, JOIN_CALL_TIMEOUT).await
                    }
                    None => Attempt::Retry {
                        hint: None,
                        why: "no leader known and no join address".to_string(),
                    },
                }
            }
        })
        .await
    }
}
