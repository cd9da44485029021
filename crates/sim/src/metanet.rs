//! The metadata's calls between simulated nodes: drove's [`MetaNet`] over the
//! [`SimNet`], so every Raft append, vote and snapshot, forwarded write, join and
//! heartbeat of a real [`Meta`] (openraft included) costs the simulated network's
//! time and meets its faults: a cut zone or a crashed host answers nothing (the
//! caller's connect gives up after [`CONNECT_TIMEOUT`], or its call times out when
//! the answer is lost), and a run that crashed sends and answers nothing more.
//! The receiver answers with [`Meta::serve`], production's dispatcher, so the
//! checks on hostile messages run here too.
use drove_meta::{Meta, MetaNet, NetAnswer, NetCall, NetError, NetFuture};
use drove_types::NodeId;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::net::{Leg, SimNet};

/// How long a call to a host that answers nothing waits before it is given up as
/// unreachable (production's connect timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Request framing: HTTP headers, roughly.
const FRAME: u64 = 256;

/// Where each simulated node's metadata serves: its addresses (peer and admin).
struct Route {
    node: NodeId,
    incarnation: u64,
    meta: Weak<Meta>,
}

/// The metadata endpoints of a simulated cluster.
pub struct SimMetaNets {
    net: Arc<SimNet>,
    routes: Mutex<BTreeMap<String, Route>>,
}

impl SimMetaNets {
    /// No endpoint yet, on `net`.
    pub fn new(net: Arc<SimNet>) -> Arc<SimMetaNets> {
        Arc::new(SimMetaNets {
            net,
            routes: Mutex::new(BTreeMap::new()),
        })
    }

    /// Serve `meta`, run `incarnation` of `node`, at `addrs`.
    pub fn register(&self, addrs: &[String], node: NodeId, incarnation: u64, meta: &Arc<Meta>) {
        let mut routes = self.routes.lock();
        for a in addrs {
            routes.insert(
                a.clone(),
                Route {
                    node,
                    incarnation,
                    meta: Arc::downgrade(meta),
                },
            );
        }
    }

    /// The way out of run `incarnation` of `node`.
    pub fn for_node(self: &Arc<Self>, node: NodeId, incarnation: u64) -> Arc<dyn MetaNet> {
        Arc::new(NodeNet {
            all: self.clone(),
            me: node,
            incarnation,
        })
    }

    fn route(&self, addr: &str) -> Option<(NodeId, u64, Weak<Meta>)> {
        let routes = self.routes.lock();
        let r = routes.get(addr)?;
        Some((r.node, r.incarnation, r.meta.clone()))
    }
}

/// One run's [`MetaNet`].
struct NodeNet {
    all: Arc<SimMetaNets>,
    me: NodeId,
    incarnation: u64,
}

impl NodeNet {
    fn net(&self) -> &SimNet {
        &self.all.net
    }

    /// Whether this run still runs (a dead one does nothing more).
    fn alive(&self) -> bool {
        self.net().alive(self.me, self.incarnation)
    }

    async fn call_inner(&self, to: &str, call: NetCall) -> Result<NetAnswer, NetError> {
        if !self.alive() {
            return std::future::pending().await;
        }
        let unreachable = || NetError::Connect(format!("sim://{to}{}: unreachable", call.path));
        let Some((node, incarnation, meta)) = self.all.route(to) else {
            return Err(NetError::Connect(format!("sim://{to}: no such address")));
        };
        let now = tokio::time::Instant::now();
        let bytes = FRAME + call.body.len() as u64;
        match self.net().send(self.me, node, bytes, now) {
            Leg::Lost => {
                tokio::time::sleep(CONNECT_TIMEOUT.min(call.timeout)).await;
                return Err(unreachable());
            }
            Leg::At(t) => {
                self.net().sleep_to(t).await;
            }
        }
        let Some(meta) = meta
            .upgrade()
            .filter(|_| self.net().alive(node, incarnation))
        else {
            // The host took the call and nobody answers: the caller times out.
            return std::future::pending().await;
        };
        let cluster = call.cluster.map(|c| c.to_hex());
        let answer = meta
            .serve(call.method, &call.path, cluster.as_deref(), &call.body)
            .await;
        drop(meta);
        if !self.net().alive(node, incarnation) {
            return std::future::pending().await;
        }
        let back = FRAME + answer.body.len() as u64;
        match self
            .net()
            .send(node, self.me, back, tokio::time::Instant::now())
        {
            Leg::Lost => return std::future::pending().await,
            Leg::At(t) => {
                self.net().sleep_to(t).await;
            }
        }
        if !self.alive() {
            return std::future::pending().await;
        }
        Ok(answer)
    }
}

impl MetaNet for NodeNet {
    fn call<'a>(&'a self, to: &'a str, call: NetCall) -> NetFuture<'a> {
        Box::pin(async move {
            let limit = call.timeout;
            let path = call.path.clone();
            match tokio::time::timeout(limit, self.call_inner(to, call)).await {
                Ok(r) => r,
                // A crashed process does nothing more.
                Err(_) if !self.alive() => std::future::pending().await,
                Err(_) => Err(NetError::Timeout(format!(
                    "sim://{to}{path}: timed out after {limit:?}"
                ))),
            }
        })
    }
}
