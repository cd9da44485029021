//! The client side of Raft RPCs: openraft's [`RaftNetworkFactory`] / [`RaftNetwork`]
//! as JSON posted to `/raft/{append,vote,snapshot}` at the peer's Raft address,
//! through the node's [`crate::MetaNet`] (HTTPS in production, the simulated network
//! in the simulator). Transport failures are mapped so openraft backs off from a
//! node that is down (`Unreachable`) and retries at once after a glitch (`Network`).
use crate::types::TypeConfig;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// How long to wait before retrying a peer that refused or timed out.
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(200);

/// Creates one [`Conn`] per peer; all share one HTTP connection pool.
#[derive(Clone)]
pub(crate) struct Network {
    client: crate::remote::Client,
}

impl Network {
    pub(crate) fn new(client: crate::remote::Client) -> Self {
        Network { client }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Conn {
        Conn {
            client: self.client.clone(),
            target,
            node: node.clone(),
        }
    }
}

/// The RPC channel to one peer.
pub(crate) struct Conn {
    client: crate::remote::Client,
    target: u64,
    node: BasicNode,
}

type RpcResult<T, E> = Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

impl Conn {
    async fn post<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        timeout: Duration,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let path = format!("/raft/{path}");
        let url = self.client.url(&self.node.addr, &path);
        let resp = self
            .client
            .post_json(&self.node.addr, &path, req, timeout)
            .await
            .map_err(|e| {
                // A refused connection or a silent peer: back off instead of spinning.
                let err = std::io::Error::other(e.why().to_string());
                if e.is_silence() {
                    RPCError::Unreachable(Unreachable::new(&err))
                } else {
                    RPCError::Network(NetworkError::new(&err))
                }
            })?;
        if !resp.is_success() {
            let err = std::io::Error::other(format!("{url} answered HTTP {}", resp.status));
            return Err(RPCError::Network(NetworkError::new(&err)));
        }
        let res: Result<Resp, RaftError<u64, E>> = serde_json::from_slice(&resp.body)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                e,
            ))
        })
    }
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible> {
        self.post("append", &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.post("snapshot", &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, openraft::error::Infallible> {
        self.post("vote", &rpc, option.hard_ttl()).await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
    }
}
