//! One NBD connection from accept to close: drives the sans-IO negotiation in
//! `handshake.rs` over the socket (reading option frames, asking the [`Exports`]
//! catalogue what it needs), then hands the stream to the transmission loop.
use crate::export::{Export, Exports};
use crate::handshake::{greeting, ExportFacts, Found, Lookup, Negotiated, Negotiation, Next};
use crate::option::{parse_option_header, ClientOption};
use crate::proto::MAX_OPTION_LEN;
use crate::{transmit, Limits};
use drove_metrics::Metrics;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Serve one connection to completion.
pub(crate) async fn serve<S>(
    mut stream: S,
    client: &str,
    exports: &dyn Exports,
    metrics: Arc<Metrics>,
    limits: &Limits,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // A client that connects and stalls must not hold a task forever; the transmission
    // phase has no such limit because an idle VM disk is legitimate.
    let negotiated = tokio::time::timeout(
        limits.handshake_timeout,
        negotiate(&mut stream, client, exports),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake timed out"))??;
    match negotiated {
        Some((export, params)) => transmit::run(stream, export, params, metrics, limits).await,
        None => Ok(()),
    }
}

fn protocol_error(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Run option haggling. `Ok(None)` when the client aborted.
async fn negotiate<S>(
    stream: &mut S,
    client: &str,
    exports: &dyn Exports,
) -> io::Result<Option<(Arc<dyn Export>, Negotiated)>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&greeting()).await?;
    stream.flush().await?;
    let mut flags = [0u8; 4];
    stream.read_exact(&mut flags).await?;
    let mut neg = Negotiation::new(u32::from_be_bytes(flags))
        .map_err(|f| protocol_error(format!("unknown client flags {:#x}", f.0)))?;
    loop {
        let mut head = [0u8; 16];
        stream.read_exact(&mut head).await?;
        let head = parse_option_header(&head)
            .map_err(|m| protocol_error(format!("bad option magic {:#018x}", m.0)))?;
        if head.len > MAX_OPTION_LEN {
            // Refuse before allocating; the data is not read, so the stream is lost.
            stream.write_all(&Negotiation::too_big(head.code)).await?;
            stream.flush().await?;
            return Err(protocol_error(format!(
                "option {} is {} bytes long",
                head.code, head.len
            )));
        }
        let mut data = vec![0u8; head.len as usize];
        stream.read_exact(&mut data).await?;
        let opt = ClientOption::parse(head.code, &data);
        let (found, opened) = look_up(exports, client, neg.lookup(&opt)).await;
        let out = neg.handle(&opt, found);
        stream.write_all(&out.replies).await?;
        stream.flush().await?;
        match out.next {
            Next::Continue => {}
            Next::Abort => return Ok(None),
            Next::Reject(why) => return Err(protocol_error(why)),
            Next::Transmit(params) => {
                let export = opened.ok_or_else(|| protocol_error("export not open".into()))?;
                return Ok(Some((export, params)));
            }
        }
    }
}

/// Ask the catalogue what the negotiation needs; also return the opened export.
async fn look_up(
    exports: &dyn Exports,
    client: &str,
    lookup: Lookup,
) -> (Found, Option<Arc<dyn Export>>) {
    match lookup {
        Lookup::Nothing => (Found::Nothing, None),
        Lookup::List => (Found::List(exports.list().await), None),
        Lookup::Export { name, description } => match exports.open(&name, client).await {
            Err(e) => (Found::Export(Err(e)), None),
            Ok(export) => {
                let description = if description {
                    // Best effort: a catalogue error only loses the description.
                    let list = exports.list().await.unwrap_or_default();
                    list.into_iter().find(|(n, _)| *n == name).map(|(_, d)| d)
                } else {
                    None
                };
                let facts = ExportFacts {
                    size: export.size(),
                    multi_conn: export.multi_conn(),
                    read_only: export.read_only(),
                    description,
                };
                (Found::Export(Ok(facts)), Some(export))
            }
        },
    }
}
