//! The internal calls between metadata nodes that are not Raft RPCs: a write forwarded
//! to the leader (`POST /meta/write`) and a join request (`POST /meta/join`). Both are
//! served only by the leader; any other node answers [`Wire::NotLeader`] with the
//! leader's address when it knows it, and the caller retries there.
use crate::net::{MetaNet, Method, NetAnswer, NetCall, NetError};
use crate::state::ApplyResult;
use drove_types::clock::Instant;
use drove_types::{Error, ErrorKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The body of every `/meta/*` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Wire<T> {
    /// Done.
    Ok(T),
    /// Refused; `Unavailable` means "try again", any other kind is final.
    Err {
        /// What went wrong.
        kind: ErrorKind,
        /// For humans.
        msg: String,
    },
    /// Ask the leader instead (admin address, when known).
    NotLeader {
        /// The leader's admin `host:port`.
        leader: Option<String>,
    },
}

impl<T> Wire<T> {
    pub(crate) fn unavailable(msg: impl Into<String>) -> Self {
        Wire::Err {
            kind: ErrorKind::Unavailable,
            msg: msg.into(),
        }
    }
}

/// A committed write: the state machine's result and the entry's log index.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Written {
    pub result: ApplyResult,
    pub index: u64,
}

/// What `GET /meta/hello` answers: who this is. The one internal route that needs no
/// cluster id, since a joining node asks it to learn the id.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Hello {
    /// The cluster the node belongs to.
    pub cluster: drove_types::ClusterId,
    /// The node's id.
    pub node: u64,
    /// Where its internal routes are (its peer port); absent from a node that served
    /// them on its admin port.
    #[serde(default)]
    pub internal: Option<String>,
}

/// The way to other nodes of one node's metadata: its [`MetaNet`] and the cluster
/// every call names (`None` before this node knows it: a joining node's hello).
#[derive(Clone)]
pub(crate) struct Client {
    pub net: Arc<dyn MetaNet>,
    pub cluster: Option<drove_types::ClusterId>,
}

impl Client {
    /// `path` at `addr` as the messages name it (`https://host:port/meta/write`).
    pub fn url(&self, addr: &str, path: &str) -> String {
        format!("{}://{addr}{path}", self.net.scheme())
    }

    /// Make one call to the routes at `addr`.
    pub async fn send(
        &self,
        addr: &str,
        method: Method,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<NetAnswer, NetError> {
        let call = NetCall {
            method,
            path: path.to_string(),
            cluster: self.cluster,
            body,
            timeout,
        };
        self.net.call(addr, call).await
    }

    /// POST `body` as JSON to `path` at `addr`.
    pub async fn post_json<Req: Serialize + ?Sized>(
        &self,
        addr: &str,
        path: &str,
        body: &Req,
        timeout: Duration,
    ) -> Result<NetAnswer, NetError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| NetError::Connect(format!("{path}: cannot encode the call: {e}")))?;
        self.send(addr, Method::Post, path, body, timeout).await
    }
}

/// A node asking to become a member (learner, then voter while there is room).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JoinRequest {
    /// Its Raft id (allocated earlier through `AllocateNodeId`).
    pub id: u64,
    /// Its admin `host:port`.
    pub addr: String,
    /// Promote it to voter only while the cluster has fewer voters than this.
    pub max_voters: usize,
    /// The newest cluster feature level its build knows (0, absent: a build from
    /// before levels, which knows level 1): refused below the cluster's.
    #[serde(default)]
    pub features: u32,
}

/// The membership a joined node ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Role {
    /// Votes and counts for the quorum.
    Voter,
    /// Receives the log only.
    Learner,
}

/// The outcome of one try against one node.
pub(crate) enum Attempt<T> {
    /// Success.
    Done(T),
    /// Worth retrying: maybe at `hint`, the leader's address.
    Retry { hint: Option<String>, why: String },
    /// Final error.
    Fail(Error),
}

impl<T> From<Wire<T>> for Attempt<T> {
    fn from(w: Wire<T>) -> Self {
        match w {
            Wire::Ok(t) => Attempt::Done(t),
            Wire::Err {
                kind: ErrorKind::Unavailable,
                msg,
            } => Attempt::Retry {
                hint: None,
                why: msg,
            },
            Wire::Err { kind, msg } => Attempt::Fail(Error::new(kind, msg)),
            Wire::NotLeader { leader } => Attempt::Retry {
                why: match &leader {
                    Some(l) => format!("not the leader (leader is {l})"),
                    None => "not the leader, leader unknown".to_string(),
                },
                hint: leader,
            },
        }
    }
}

/// POST `body` as JSON to `http://{addr}{path}` and decode a [`Wire`] answer. Every
/// transport failure is retryable: writes carry a request id, so a write whose
/// answer was lost is applied once even when sent again.
pub(crate) async fn post<Req, T>(
    client: &crate::remote::Client,
    addr: &str,
    path: &str,
    body: &Req,
    timeout: Duration,
) -> Attempt<T>
where
    Req: Serialize,
    T: DeserializeOwned,
{
    match call(client, addr, path, body, timeout).await {
        Ok(w) => w.into(),
        Err(n) => Attempt::Retry {
            hint: None,
            why: n.why,
        },
    }
}

/// A call that got no [`Wire`] answer.
#[derive(Debug, Clone)]
pub(crate) struct NoAnswer {
    /// Why, for humans.
    pub why: String,
    /// The receiver may have got the call (and done its work): it was sent, and
    /// what came back, if anything, was not an answer.
    pub maybe_delivered: bool,
    /// The receiver answered 404: it does not know the route (an older version).
    pub missing_route: bool,
}

/// [`post`], keeping apart the calls that got no answer, and whether those may have
/// reached the receiver.
pub(crate) async fn call<Req, T>(
    client: &crate::remote::Client,
    addr: &str,
    path: &str,
    body: &Req,
    timeout: Duration,
) -> Result<Wire<T>, NoAnswer>
where
    Req: Serialize,
    T: DeserializeOwned,
{
    let url = client.url(addr, path);
    let resp = match client.post_json(addr, path, body, timeout).await {
        Ok(r) => r,
        Err(e) => {
            return Err(NoAnswer {
                why: e.why().to_string(),
                maybe_delivered: e.maybe_delivered(),
                missing_route: false,
            })
        }
    };
    if resp.status == 403 {
        // Refused for good (another cluster): the body says why.
        return Ok(
            serde_json::from_slice::<Wire<T>>(&resp.body).unwrap_or_else(|_| Wire::Err {
                kind: ErrorKind::Invalid,
                msg: format!("{url} refused the call"),
            }),
        );
    }
    if !resp.is_success() {
        // A route the receiver does not have never reached a handler.
        let missing_route = resp.status == 404;
        return Err(NoAnswer {
            why: format!("{url} answered HTTP {}", resp.status),
            maybe_delivered: !missing_route,
            missing_route,
        });
    }
    serde_json::from_slice::<Wire<T>>(&resp.body).map_err(|e| NoAnswer {
        why: format!("{url}: bad answer: {e}"),
        maybe_delivered: true,
        missing_route: false,
    })
}

/// Call `once` until it succeeds, fails for good, or `deadline` passes. `once` gets
/// the leader address hinted by the previous try, if any; a fresh hint is followed at
/// once (a few times), otherwise tries are spaced by a growing delay. Failed tries
/// are logged at debug level: callers whose retries are routine use this.
pub(crate) async fn retry<T, F, Fut>(deadline: Instant, what: &str, once: F) -> Result<T, Error>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    retry_with(deadline, what, None, once).await
}

/// [`retry`] whose wait between two tries ends early when `wake` resolves: a write
/// to the metadata leader waits for the next leader to be known, not for the back-off
/// (which had grown to 0.8-1 s by the time an election ended).
pub(crate) async fn retry_waking<T, F, Fut, W, WFut>(
    deadline: Instant,
    what: &str,
    once: F,
    wake: W,
) -> Result<T, Error>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Attempt<T>>,
    W: FnMut() -> WFut,
    WFut: Future<Output = ()>,
{
    retry_inner(deadline, what, None, once, wake).await
}

/// [`retry`] that also says, at warn level, what failed and how long it keeps
/// trying: on the first failure and then every `report_every`. For waits a person
/// is watching (a node joining through an address that does not answer), where
/// silence looks like a hang.
pub(crate) async fn retry_with<T, F, Fut>(
    deadline: Instant,
    what: &str,
    report_every: Option<Duration>,
    once: F,
) -> Result<T, Error>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    retry_inner(
        deadline,
        what,
        report_every,
        once,
        std::future::pending::<()>,
    )
    .await
}

async fn retry_inner<T, F, Fut, W, WFut>(
    deadline: Instant,
    what: &str,
    report_every: Option<Duration>,
    mut once: F,
    mut wake: W,
) -> Result<T, Error>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Attempt<T>>,
    W: FnMut() -> WFut,
    WFut: Future<Output = ()>,
{
    let started = Instant::now();
    let mut reported: Option<Instant> = None;
    let mut hint = None;
    let mut delay = Duration::from_millis(50);
    let mut followed = 0;
    loop {
        let (next_hint, why) = match once(hint.take()).await {
            Attempt::Done(t) => return Ok(t),
            Attempt::Fail(e) => return Err(e),
            Attempt::Retry { hint, why } => (hint, why),
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::unavailable(match report_every {
                None => format!("{what}: {why}"),
                Some(_) => format!(
                    "{what}: {why} (gave up after {} s)",
                    (now - started).as_secs()
                ),
            }));
        }
        match report_every {
            Some(every) if reported.is_none_or(|r| now - r >= every) => {
                reported = Some(now);
                tracing::warn!(
                    "{what}: {why}; retrying, giving up in {} s",
                    (deadline - now).as_secs_f64().ceil()
                );
            }
            _ => tracing::debug!("{what}: {why}; retrying"),
        }
        if next_hint.is_some() && followed < 3 {
            followed += 1;
            hint = next_hint;
            continue;
        }
        followed = 0;
        hint = next_hint;
        tokio::select! {
            _ = tokio::time::sleep(delay.min(deadline - now)) => {
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            _ = wake() => delay = Duration::from_millis(50),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Three tries that fail, then one that succeeds: with a `wake` that says a new
    /// leader is known at once, no back-off is waited out; without, the back-off
    /// (50 + 100 + 200 ms) is.
    #[tokio::test]
    async fn test_a_new_leader_ends_the_wait_between_tries() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let tries = AtomicUsize::new(0);
        let once = |_: Option<String>| {
            let n = tries.fetch_add(1, Ordering::Relaxed);
            async move {
                if n % 4 < 3 {
                    Attempt::Retry {
                        hint: None,
                        why: "no leader known".into(),
                    }
                } else {
                    Attempt::Done(n)
                }
            }
        };
        let t = Instant::now();
        let n = retry_waking(deadline, "test", once, || async {})
            .await
            .unwrap();
        assert_eq!(n, 3);
        assert!(t.elapsed() < Duration::from_millis(40), "{:?}", t.elapsed());
        let t = Instant::now();
        let n = retry(deadline, "test", once).await.unwrap();
        assert_eq!(n, 7);
        assert!(
            t.elapsed() >= Duration::from_millis(350),
            "{:?}",
            t.elapsed()
        );
    }
}
