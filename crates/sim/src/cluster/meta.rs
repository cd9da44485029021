//! The metadata as a simulated node sees it: drove's [`MetaApi`] over the
//! simulated network and clock, so that the daemon's own lock service
//! ([`drove_daemon::MetaLocks`]), post-crash settle ([`drove_daemon::Settler`]) and
//! mark-downs ([`drove_daemon::MetaMembership`]) run in the simulator.
//!
//! A command commits as [`SimCluster::command_from`] says (a round trip to a
//! majority, or the give-up time for a node cut off from it). A renewal is checked
//! against the lock table when it commits, as the leader checks it
//! ([`SimCluster::renew_from`]). Each run of a node's process has its own
//! [`SimMeta`]: once that run crashed, its calls never answer (a dead process does
//! nothing more), so a task it left behind cannot act for the next run.
use drove_meta::{Command, MetaApi, MetaFuture, MetaState, Renew, Reply, VdiLock};
use drove_types::clock::Instant;
use drove_types::{Error, NodeId};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::SimCluster;

/// One run of a node's process, as the metadata's client.
pub struct SimMeta {
    cluster: Weak<SimCluster>,
    me: NodeId,
    /// The run: its transport's incarnation.
    incarnation: u64,
    /// The metadata as this run last saw it (a node cut off keeps its old view).
    view: Mutex<Arc<MetaState>>,
    /// When this run last reached the metadata's majority.
    reached: Mutex<Instant>,
}

impl SimMeta {
    pub(crate) fn new(
        cluster: Weak<SimCluster>,
        me: NodeId,
        incarnation: u64,
        view: Arc<MetaState>,
    ) -> Arc<SimMeta> {
        Arc::new(SimMeta {
            cluster,
            me,
            incarnation,
            view: Mutex::new(view),
            reached: Mutex::new(Instant::now()),
        })
    }

    /// The metadata this run now sees.
    pub(crate) fn set_view(&self, st: Arc<MetaState>) {
        *self.view.lock() = st;
        *self.reached.lock() = Instant::now();
    }

    /// The cluster, while this run of the node is the one running.
    fn running(&self) -> Option<Arc<SimCluster>> {
        let c = self.cluster.upgrade()?;
        let live = c
            .node(self.me)
            .is_some_and(|n| n.transport.alive() && n.transport.incarnation() == self.incarnation);
        live.then_some(c)
    }

    /// The cluster, if this run is the one running; a dead run waits forever (it
    /// does nothing more).
    async fn alive(&self) -> Arc<SimCluster> {
        match self.running() {
            Some(c) => c,
            None => std::future::pending().await,
        }
    }

    /// `res`, if this run still runs to hear it (a dead run waits forever).
    async fn answer<T>(&self, res: drove_types::Result<T>) -> drove_types::Result<T> {
        if self.running().is_none() {
            return std::future::pending().await;
        }
        if res.is_ok() {
            *self.reached.lock() = Instant::now();
        }
        res
    }
}

impl MetaApi for SimMeta {
    fn node_id(&self) -> NodeId {
        self.me
    }

    fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn state(&self) -> Arc<MetaState> {
        self.view.lock().clone()
    }

    fn execute(&self, cmd: Command) -> MetaFuture<'_, Reply> {
        Box::pin(async move {
            let c = self.alive().await;
            let res = c.command_from(self.me, cmd).await;
            drop(c);
            self.answer(res).await
        })
    }

    fn renew_lock(&self, r: Renew) -> MetaFuture<'_, VdiLock> {
        Box::pin(async move {
            let c = self.alive().await;
            let res = c.renew_from(self.me, r).await;
            drop(c);
            match self.answer(res).await? {
                Reply::Lock(l) => Ok(l),
                other => Err(Error::invalid(format!("A renewal answered {other:?}"))),
            }
        })
    }

    fn quorum_age(&self) -> Option<Duration> {
        let c = self.cluster.upgrade()?;
        if c.reaches_meta(self.me) {
            *self.reached.lock() = Instant::now();
            return Some(Duration::ZERO);
        }
        Some(self.reached.lock().elapsed())
    }
}
