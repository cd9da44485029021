//! The peer side of the transport: accepts connections from other nodes' gateways
//! and applies their requests to the local object store, concurrently, answering
//! out of order. A primary-copy write is also forwarded to the nodes it names, and
//! answered only when they all have it. Garbage on the port closes that connection
//! and nothing else.
use bytes::Bytes;
use drove_metrics::Metrics;
use drove_proto::{Frame, PeerReq, PeerResp, WireError};
use drove_types::Result;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::local::LocalStore;
use crate::PeerPool;

/// Requests one connection may have in flight.
const MAX_IN_FLIGHT: usize = 256;

/// Serves this node's object store to its peers.
pub struct PeerServer {
    local: Arc<LocalStore>,
    pool: Arc<PeerPool>,
    metrics: Arc<Metrics>,
}

impl PeerServer {
    /// A server over `store`; `pool` is used to forward primary-copy writes.
    pub fn new(local: Arc<LocalStore>, pool: Arc<PeerPool>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(PeerServer {
            local,
            pool,
            metrics,
        })
    }

    /// Accept connections until the listener fails. The connections belong to this
    /// future: dropping it (a node shutting down) closes every one of them.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = accepted?;
                    let me = self.clone();
                    conns.spawn(async move {
                        if let Err(e) = me.serve_conn(stream).await {
                            tracing::debug!(%peer, "peer connection closed: {e}");
                        }
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    }

    async fn serve_conn(self: Arc<Self>, stream: TcpStream) -> std::io::Result<()> {
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::channel::<drove_proto::Encoded>(1024);
        let writer = tokio::spawn(crate::writer::drain(rx, wr, |_| {}));
        let sem = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut rd = BufReader::with_capacity(256 << 10, rd);
        let result = loop {
            let frame = match Frame::<PeerReq>::read_from(&mut rd).await {
                Ok(Some((f, _))) => f,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            let Ok(permit) = sem.clone().acquire_owned().await else {
                break Ok(());
            };
            let me = self.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let reply = me.handle(frame).await;
                let _ = tx.send(reply).await;
                drop(permit);
            });
        };
        drop(tx);
        let _ = writer.await;
        result
    }

    async fn handle(&self, frame: Frame<PeerReq>) -> drove_proto::Encoded {
        let start = Instant::now();
        let op = frame.header.op_name();
        let in_bytes = frame.payload.len() as u64;
        let res = self.apply(&frame.header, frame.payload).await;
        let (header, payload) = match res {
            Ok(r) => r,
            Err(e) => (PeerResp::Err(WireError::from(e)), Bytes::new()),
        };
        let ok = !matches!(header, PeerResp::Err(_));
        self.metrics.peer_server_op(
            op,
            in_bytes + payload.len() as u64,
            start.elapsed().as_secs_f64(),
            ok,
        );
        let reply = Frame {
            id: frame.id,
            header,
            payload,
        };
        match reply.encode_parts() {
            Ok(b) => b,
            Err(e) => {
                let fallback = Frame {
                    id: frame.id,
                    header: PeerResp::Err(WireError {
                        kind: drove_types::ErrorKind::Io,
                        msg: format!("Cannot encode reply: {e}"),
                    }),
                    payload: Bytes::new(),
                };
                fallback.encode_parts().unwrap_or_default()
            }
        }
    }

    async fn apply(&self, req: &PeerReq, payload: Bytes) -> Result<(PeerResp, Bytes)> {
        crate::local::apply_and_forward(&self.local, &self.pool, req, payload).await
    }
}
