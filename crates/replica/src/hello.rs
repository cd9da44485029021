//! The I/O of the hello that opens every peer connection (the messages and the
//! decisions are in [`drove_proto::hello`]): the client sends its hello and waits
//! for the answer; the server reads one small frame, answers, and on a refusal says
//! why, logs it and closes. Both return the wire version the connection uses.
use drove_proto::frame::FrameError;
use drove_proto::{
    legacy, Budget, Frame, Hello, HelloReply, ReadLimits, Speaker, HELLO_MAX, HELLO_VERSION,
};
use drove_types::{Error, NodeId, Result};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::accept::LogEvery;

/// How long a refused connection is drained before it is closed: closing a socket
/// with unread input sends a reset, which can destroy the refusal on its way.
const LINGER: Duration = Duration::from_secs(2);

/// Say `mine` to node `node` (dialled at `addr`) on `stream` and check its answer;
/// `Ok` holds the connection's wire version. Errors are `Unavailable` and name the
/// node, the address and the reason; a refusal (versions, cluster) is also logged,
/// at most once a second through `log`.
pub(crate) async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    mine: &Speaker,
    node: NodeId,
    addr: &str,
    log: &Mutex<LogEvery>,
) -> Result<u8> {
    let fail = |why: String| Error::unavailable(format!("Node {node} at {addr} {why}"));
    let refused = |why: String| {
        let e = fail(why);
        if let Some(skipped) = log.lock().ready() {
            tracing::warn!(%node, %addr, skipped, "peer connection refused: {e}");
        }
        e
    };
    let (header, payload) = mine.hello();
    let hello = Frame {
        id: 0,
        header,
        payload: bytes::Bytes::from(payload),
    }
    .encode_as(HELLO_VERSION)
    .map_err(|e| Error::invalid(format!("Cannot encode a hello: {e}")))?;
    stream
        .write_all(&hello.head)
        .await
        .map_err(|e| fail(format!("did not take our hello: {e}")))?;
    stream
        .write_all(&hello.payload)
        .await
        .map_err(|e| fail(format!("did not take our hello: {e}")))?;
    let limits = ReadLimits {
        max_body: HELLO_MAX,
        budget: None,
        version: HELLO_VERSION,
    };
    let reply = match Frame::<HelloReply>::read_limited(stream, &limits).await {
        Ok(Some((f, _))) => f,
        Ok(None) => {
            return Err(fail(
                "closed the connection without answering our hello (at its \
                 connection limit, or a node of drove wire version 1?)"
                    .into(),
            ))
        }
        Err(e) => match FrameError::of(&e) {
            Some(FrameError::Version { got, .. }) => {
                return Err(refused(format!(
                    "answered our hello in drove wire version {got}, this node speaks \
                     versions {}: mixed versions during an upgrade?",
                    mine.wire
                )))
            }
            _ => return Err(fail(format!("answered our hello with: {e}"))),
        },
    };
    mine.check_reply(node, &reply.header, &reply.payload)
        .map_err(refused)
}

/// What the server needs to greet a connection.
pub(crate) struct Greeter {
    /// What this node says.
    pub mine: Speaker,
    /// Time allowed to say hello after connecting.
    pub wait: Duration,
    /// Refusals are logged at most once a second: a node of another version may
    /// dial again for every request.
    pub log: Mutex<LogEvery>,
}

impl Greeter {
    /// Read the client's hello from `rd` and answer on `wr`. `Ok(Some)`: welcome,
    /// go on in the version given; `Ok(None)`: refused (logged, answered, drained)
    /// or gone.
    pub async fn greet<R, W>(
        &self,
        rd: &mut R,
        wr: &mut W,
        peer: SocketAddr,
        budget: &Budget,
    ) -> std::io::Result<Option<(Hello, u8)>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let limits = ReadLimits {
            max_body: HELLO_MAX,
            budget: Some(budget),
            version: HELLO_VERSION,
        };
        let read = Frame::<Hello>::read_limited(rd, &limits);
        let frame = match tokio::time::timeout(self.wait, read).await {
            Err(_) => {
                tracing::debug!(%peer, "peer connection closed: no hello within {:?}", self.wait);
                return Ok(None);
            }
            Ok(Ok(Some((f, _)))) => f,
            Ok(Ok(None)) => return Ok(None),
            Ok(Err(e)) => return self.refuse_frame(rd, wr, peer, e).await,
        };
        let answer = self.mine.answer(&frame.header, &frame.payload);
        let bytes = Frame {
            id: frame.id,
            header: answer.reply.clone(),
            payload: bytes::Bytes::from(answer.payload),
        }
        .encode_as(HELLO_VERSION)
        .map_err(std::io::Error::other)?;
        match (answer.reply, answer.version) {
            (HelloReply::Welcome(_), Some(v)) => {
                wr.write_all(&bytes.head).await?;
                wr.write_all(&bytes.payload).await?;
                Ok(Some((frame.header, v)))
            }
            (reply, _) => {
                let why = match reply {
                    HelloReply::Refused(why) => why,
                    HelloReply::Welcome(_) => "no wire version chosen".into(),
                };
                self.log(peer, &format!("refused node {}: {why}", frame.header.node));
                linger_close(rd, wr, &bytes.head).await;
                Ok(None)
            }
        }
    }

    /// A first frame that is not a hello of this version.
    async fn refuse_frame<R, W>(
        &self,
        rd: &mut R,
        wr: &mut W,
        peer: SocketAddr,
        e: std::io::Error,
    ) -> std::io::Result<Option<(Hello, u8)>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let Some(fe) = FrameError::of(&e) else {
            return Err(e);
        };
        let answer = match fe {
            // A version-1 node sent a request: answer its id in its own format.
            FrameError::Version {
                got: legacy::V1, ..
            } => {
                let mut id = [0u8; 8];
                match tokio::time::timeout(self.wait, rd.read_exact(&mut id)).await {
                    Ok(Ok(_)) => legacy::v1_refusal(u64::from_be_bytes(id), self.mine.wire).ok(),
                    _ => None,
                }
            }
            // A node that does not open with a hello of the frozen layout: answer
            // in that layout, which every version keeps decodable.
            FrameError::Version { .. } => Frame {
                id: 0,
                header: HelloReply::Refused(self.version_refusal(fe)),
                payload: bytes::Bytes::new(),
            }
            .encode_as(HELLO_VERSION)
            .ok()
            .map(|e| e.head),
            _ => {
                tracing::debug!(%peer, "peer connection closed before a hello: {fe}");
                return Ok(None);
            }
        };
        self.log(peer, &self.version_refusal(fe));
        linger_close(rd, wr, &answer.unwrap_or_default()).await;
        Ok(None)
    }

    /// Why a first frame of another version is refused, naming both sides.
    fn version_refusal(&self, fe: &FrameError) -> String {
        match fe {
            FrameError::Version { got, .. } => format!(
                "Peer speaks drove wire version {got}, this node speaks versions {}: \
                 mixed versions during an upgrade?",
                self.mine.wire
            ),
            other => other.to_string(),
        }
    }

    pub(crate) fn log(&self, peer: SocketAddr, why: &str) {
        if let Some(skipped) = self.log.lock().ready() {
            tracing::warn!(%peer, skipped, "refused a peer connection: {why}");
        }
    }
}

/// Send `last`, close the sending side, and read (and drop) what the other side
/// still sends until it closes too or [`LINGER`] passes.
async fn linger_close<R, W>(rd: &mut R, wr: &mut W, last: &[u8])
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let _ = tokio::time::timeout(LINGER, async {
        wr.write_all(last).await?;
        wr.shutdown().await?;
        let mut sink = [0u8; 16 << 10];
        while rd.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}
