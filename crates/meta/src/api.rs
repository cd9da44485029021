//! The metadata as the rest of a node uses it, behind one trait: the lock service,
//! lease renewal, the post-crash settle and the gateway's mark-downs talk to
//! [`MetaApi`], which [`Meta`] implements in production (openraft over HTTPS) and
//! the simulator implements over its simulated network and clock. That is what lets
//! the simulator run the daemon's own lock and settle code.
use crate::lease::Renew;
use crate::meta::Meta;
use crate::state::{Command, MetaState, Reply, VdiLock};
use drove_types::{NodeId, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A future a [`MetaApi`] call returns.
pub type MetaFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// What a node asks of the cluster metadata.
pub trait MetaApi: Send + Sync {
    /// This node's id.
    fn node_id(&self) -> NodeId;
    /// This run of the node's process (a lock carries it: a restarted node does not
    /// inherit its previous run's locks).
    fn incarnation(&self) -> u64;
    /// The metadata as this node last applied it.
    fn state(&self) -> Arc<MetaState>;
    /// Commit `cmd` through the leader and answer its reply.
    fn execute(&self, cmd: Command) -> MetaFuture<'_, Reply>;
    /// Renew a write lock this node holds (see [`Meta::renew_lock`]).
    fn renew_lock(&self, r: Renew) -> MetaFuture<'_, VdiLock>;
    /// How long ago this node last knew of a working metadata majority (see
    /// [`Meta::quorum_age`]); `None`: not since it started.
    fn quorum_age(&self) -> Option<Duration>;
}

impl MetaApi for Meta {
    fn node_id(&self) -> NodeId {
        Meta::node_id(self)
    }

    fn incarnation(&self) -> u64 {
        Meta::incarnation(self)
    }

    fn state(&self) -> Arc<MetaState> {
        Meta::state(self)
    }

    fn execute(&self, cmd: Command) -> MetaFuture<'_, Reply> {
        Box::pin(Meta::execute(self, cmd))
    }

    fn renew_lock(&self, r: Renew) -> MetaFuture<'_, VdiLock> {
        Box::pin(Meta::renew_lock(self, r))
    }

    fn quorum_age(&self) -> Option<Duration> {
        Meta::quorum_age(self)
    }
}
