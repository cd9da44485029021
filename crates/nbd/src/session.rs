//! One NBD connection from accept to close: drives the sans-IO negotiation in
//! `handshake.rs` over the socket (reading option frames, asking the [`Exports`]
//! catalogue what it needs), upgrades it to TLS when the client sends STARTTLS on a
//! listener that offers it, then hands the stream to the transmission loop.
use crate::export::{ClientInfo, Credential, Export, Exports};
use crate::handshake::{
    greeting, ExportFacts, Found, Lookup, Negotiated, Negotiation, Next, TlsMode,
};
use crate::option::{parse_option_header, ClientOption};
use crate::proto::MAX_OPTION_LEN;
use crate::{transmit, Limits};
use drove_metrics::Metrics;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// TLS as one listener offers it: the mode and, unless it is off, the server
/// configuration the STARTTLS handshake runs with.
#[derive(Clone)]
pub(crate) struct ListenerTls {
    pub(crate) mode: TlsMode,
    pub(crate) acceptor: Option<TlsAcceptor>,
}

impl ListenerTls {
    /// No TLS (the unix socket; a node without certificates).
    pub(crate) fn off() -> Self {
        ListenerTls {
            mode: TlsMode::Off,
            acceptor: None,
        }
    }
}

/// Serve one connection to completion.
pub(crate) async fn serve<S>(
    stream: S,
    client: ClientInfo,
    exports: &dyn Exports,
    metrics: Arc<Metrics>,
    limits: &Limits,
    tls: &ListenerTls,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // A client that connects and stalls must not hold a task forever; the transmission
    // phase has no such limit because an idle VM disk is legitimate. The TLS handshake
    // is part of negotiation, so it is under the same limit.
    let negotiated = tokio::time::timeout(
        limits.handshake_timeout,
        negotiate(stream, &client, exports, tls),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake timed out"))??;
    match negotiated {
        Ending::Aborted => Ok(()),
        Ending::Plain(stream, export, params) => {
            transmit::run(stream, export, params, metrics, limits).await
        }
        Ending::Tls(stream, export, params) => {
            transmit::run(*stream, export, params, metrics, limits).await
        }
    }
}

fn protocol_error(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// How negotiation ended, with the stream to transmit on.
enum Ending<S> {
    Aborted,
    Plain(S, Arc<dyn Export>, Negotiated),
    Tls(Box<TlsStream<S>>, Arc<dyn Export>, Negotiated),
}

/// How one run of option haggling on one stream ended.
enum Haggled {
    Aborted,
    Transmit(Arc<dyn Export>, Negotiated),
    StartTls,
}

/// Greet, haggle, and upgrade to TLS when the client asks and the listener offers it.
async fn negotiate<S>(
    mut stream: S,
    client: &ClientInfo,
    exports: &dyn Exports,
    tls: &ListenerTls,
) -> io::Result<Ending<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&greeting()).await?;
    stream.flush().await?;
    let mut flags = [0u8; 4];
    stream.read_exact(&mut flags).await?;
    let mut neg = Negotiation::with_tls(u32::from_be_bytes(flags), tls.mode)
        .map_err(|f| protocol_error(format!("unknown client flags {:#x}", f.0)))?;
    match haggle(&mut stream, &mut neg, client, exports).await? {
        Haggled::Aborted => return Ok(Ending::Aborted),
        Haggled::Transmit(e, p) => return Ok(Ending::Plain(stream, e, p)),
        Haggled::StartTls => {}
    }
    let acceptor = tls
        .acceptor
        .as_ref()
        .ok_or_else(|| protocol_error("STARTTLS accepted without certificates".into()))?;
    // Options are read straight from the socket, never through a buffer, so bytes a
    // client (or a man in the middle) sent after STARTTLS are not taken as options:
    // they go to the TLS handshake, which fails on them.
    let mut stream = acceptor.accept(stream).await?;
    // From here on the client is who its certificate says (the listener's
    // configuration decides whether one is required).
    let client = match stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    {
        Some(cert) => {
            let cn = drove_tls::common_name(cert);
            ClientInfo {
                label: format!(
                    "{} (certificate {})",
                    client.label,
                    cn.as_deref().unwrap_or("without a name")
                ),
                credential: Credential::Certificate(cn),
            }
        }
        None => client.clone(),
    };
    match haggle(&mut stream, &mut neg, &client, exports).await? {
        Haggled::Aborted => Ok(Ending::Aborted),
        Haggled::Transmit(e, p) => Ok(Ending::Tls(Box::new(stream), e, p)),
        // The negotiation answers a second STARTTLS with an error, never an ACK.
        Haggled::StartTls => Err(protocol_error("second STARTTLS".into())),
    }
}

/// Run option haggling until the client aborts, picks an export or starts TLS.
async fn haggle<S>(
    stream: &mut S,
    neg: &mut Negotiation,
    client: &ClientInfo,
    exports: &dyn Exports,
) -> io::Result<Haggled>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
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
            Next::Abort => return Ok(Haggled::Aborted),
            Next::Reject(why) => return Err(protocol_error(why)),
            Next::StartTls => return Ok(Haggled::StartTls),
            Next::Transmit(params) => {
                let export = opened.ok_or_else(|| protocol_error("export not open".into()))?;
                return Ok(Haggled::Transmit(export, params));
            }
        }
    }
}

/// Ask the catalogue what the negotiation needs; also return the opened export.
async fn look_up(
    exports: &dyn Exports,
    client: &ClientInfo,
    lookup: Lookup,
) -> (Found, Option<Arc<dyn Export>>) {
    match lookup {
        Lookup::Nothing => (Found::Nothing, None),
        Lookup::List => (Found::List(exports.list(client).await), None),
        Lookup::Export { name, description } => match exports.open(&name, client).await {
            Err(e) => (Found::Export(Err(e)), None),
            Ok(export) => {
                let description = if description {
                    // Best effort: a catalogue error only loses the description.
                    let list = exports.list(client).await.unwrap_or_default();
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
