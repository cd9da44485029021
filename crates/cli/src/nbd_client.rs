//! A small NBD client for the CLI's block-level tools: `vdi export-diff` reads
//! chosen ranges of two snapshots and `vdi import-diff` writes chosen ranges, which
//! qemu-img and nbdcopy do not offer. Fixed newstyle handshake, `NBD_OPT_STARTTLS`
//! on TCP when the CLI has a client certificate ([`crate::nbd_target`]), then
//! `NBD_OPT_GO` and one request at a time with simple replies. A server that
//! requires TLS from a CLI without a certificate is refused with a message saying
//! what to do.
use anyhow::{bail, Context, Result};
use drove_nbd::proto::*;
use drove_nbd::request::{Command as NbdCommand, Request as NbdRequest};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub(crate) use crate::nbd_target::Target;
use crate::nbd_target::{client_config, server_name, NEEDS_CERT};

/// Largest read or write sent in one request.
pub(crate) const MAX_REQUEST: usize = 1 << 20;
/// Largest write-zeroes request.
const MAX_ZEROES: u64 = 32 << 20;
/// Largest option reply accepted during the handshake.
const MAX_OPTION_REPLY: usize = 1 << 16;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One connection to one export.
pub(crate) struct NbdClient {
    s: Box<dyn Stream>,
    size: u64,
    flags: u16,
    cookie: u64,
}

impl NbdClient {
    /// Connect to `export` at `target`.
    pub(crate) async fn connect(target: &Target, export: &str) -> Result<Self> {
        let (s, tls): (Box<dyn Stream>, _) = match target {
            Target::Unix(p) => (
                Box::new(
                    tokio::net::UnixStream::connect(p)
                        .await
                        .with_context(|| format!("Cannot connect to {}", p.display()))?,
                ),
                None,
            ),
            Target::Tcp { addr, tls } => {
                // Certificates are read before the connection: a bad one is reported
                // as such, not as a failed handshake.
                let tls = match tls {
                    Some(dir) => Some((server_name(addr)?, client_config(dir)?)),
                    None => None,
                };
                let s = tokio::net::TcpStream::connect(addr)
                    .await
                    .with_context(|| format!("Cannot connect to {addr}"))?;
                let _ = s.set_nodelay(true);
                (Box::new(s), tls)
            }
        };
        let (s, size, flags) = handshake(s, tls, export)
            .await
            .with_context(|| format!("Cannot open export '{export}'"))?;
        Ok(NbdClient {
            s,
            size,
            flags,
            cookie: 0,
        })
    }

    /// The export's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Whether the server serves the export read-only.
    pub(crate) fn read_only(&self) -> bool {
        self.flags & NBD_FLAG_READ_ONLY != 0
    }

    /// Send one request (and `payload`) and read its simple reply's header; the
    /// data of a read follows it.
    async fn request(
        &mut self,
        command: NbdCommand,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<()> {
        self.cookie += 1;
        let req = NbdRequest {
            flags: 0,
            command,
            cookie: self.cookie,
            offset,
            length,
        };
        self.s.write_all(&req.encode()).await?;
        if !payload.is_empty() {
            self.s.write_all(payload).await?;
        }
        self.s.flush().await?;
        if self.s.read_u32().await? != NBD_SIMPLE_REPLY_MAGIC {
            bail!("bad reply magic");
        }
        let error = self.s.read_u32().await?;
        let cookie = self.s.read_u64().await?;
        if cookie != self.cookie {
            bail!(
                "a reply to request {cookie} came for request {}",
                self.cookie
            );
        }
        if error != 0 {
            bail!("the server answered {}", errno_name(error));
        }
        Ok(())
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => bail!(
                "{len} bytes at offset {offset} go past the end of the export ({} bytes)",
                self.size
            ),
        }
    }

    /// Fill `buf` from `offset`.
    pub(crate) async fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let mut off = offset;
        for chunk in buf.chunks_mut(MAX_REQUEST) {
            self.request(NbdCommand::Read, off, chunk.len() as u32, &[])
                .await
                .with_context(|| format!("Reading {} bytes at offset {off}", chunk.len()))?;
            self.s.read_exact(chunk).await?;
            off += chunk.len() as u64;
        }
        Ok(())
    }

    /// Write `data` at `offset`.
    pub(crate) async fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        let mut off = offset;
        for chunk in data.chunks(MAX_REQUEST) {
            self.request(NbdCommand::Write, off, chunk.len() as u32, chunk)
                .await
                .with_context(|| format!("Writing {} bytes at offset {off}", chunk.len()))?;
            off += chunk.len() as u64;
        }
        Ok(())
    }

    /// Make `len` bytes at `offset` read as zeros.
    pub(crate) async fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        let end = offset + len;
        let mut off = offset;
        while off < end {
            let n = (end - off).min(MAX_ZEROES);
            if self.flags & NBD_FLAG_SEND_WRITE_ZEROES != 0 {
                self.request(NbdCommand::WriteZeroes, off, n as u32, &[])
                    .await
                    .with_context(|| format!("Zeroing {n} bytes at offset {off}"))?;
            } else {
                let zeros = vec![0u8; n as usize];
                self.write(off, &zeros).await?;
            }
            off += n;
        }
        Ok(())
    }

    /// Make everything written so far durable.
    pub(crate) async fn flush(&mut self) -> Result<()> {
        self.request(NbdCommand::Flush, 0, 0, &[])
            .await
            .context("Flushing the writes")
    }

    /// End the session politely (the server releases the export).
    pub(crate) async fn disconnect(mut self) -> Result<()> {
        self.cookie += 1;
        let req = NbdRequest {
            flags: 0,
            command: NbdCommand::Disc,
            cookie: self.cookie,
            offset: 0,
            length: 0,
        };
        self.s.write_all(&req.encode()).await?;
        self.s.flush().await?;
        let _ = self.s.shutdown().await;
        Ok(())
    }
}

/// The TLS of one connection: the name the node's certificate must carry, and the
/// client configuration.
type Tls = (
    rustls::pki_types::ServerName<'static>,
    std::sync::Arc<rustls::ClientConfig>,
);

/// Greet, start TLS when `tls` is given, and open `export`: the stream to transmit
/// on, the export's size and transmission flags.
async fn handshake(
    mut s: Box<dyn Stream>,
    tls: Option<Tls>,
    export: &str,
) -> Result<(Box<dyn Stream>, u64, u16)> {
    if s.read_u64().await? != NBDMAGIC || s.read_u64().await? != IHAVEOPT {
        bail!("not a newstyle NBD server");
    }
    let server = s.read_u16().await?;
    if server & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        bail!("the server does not speak fixed newstyle NBD");
    }
    let mut flags = NBD_FLAG_C_FIXED_NEWSTYLE;
    if server & NBD_FLAG_NO_ZEROES != 0 {
        flags |= NBD_FLAG_C_NO_ZEROES;
    }
    s.write_u32(flags).await?;
    if let Some((name, config)) = tls {
        s.write_all(&drove_nbd::option::encode_option(NBD_OPT_STARTTLS, &[]))
            .await?;
        s.flush().await?;
        let (ty, body) = read_reply(&mut s, NBD_OPT_STARTTLS).await?;
        match ty {
            NBD_REP_ACK => {}
            NBD_REP_ERR_POLICY => bail!(
                "the node's NBD TCP port does not offer TLS (--nbd-tls off); this CLI \
                 speaks TLS there because DROVE_CA holds a client certificate: run it on \
                 the node's host (its unix socket) or without that certificate"
            ),
            t => bail!(
                "STARTTLS refused (reply {t:#x}): {}",
                String::from_utf8_lossy(&body).trim()
            ),
        }
        let t = tokio_rustls::TlsConnector::from(config)
            .connect(name, s)
            .await
            .context("TLS handshake with the node's NBD port")?;
        s = Box::new(t);
    }
    let name = export.as_bytes();
    let mut data = Vec::with_capacity(6 + name.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name);
    // No information requests: the server sends NBD_INFO_EXPORT in any case.
    data.extend_from_slice(&0u16.to_be_bytes());
    s.write_all(&drove_nbd::option::encode_option(NBD_OPT_GO, &data))
        .await?;
    s.flush().await?;
    let mut export_info = None;
    loop {
        let (ty, body) = read_reply(&mut s, NBD_OPT_GO).await?;
        match ty {
            NBD_REP_ACK => break,
            NBD_REP_INFO => {
                if body.len() >= 12 && u16::from_be_bytes([body[0], body[1]]) == NBD_INFO_EXPORT {
                    let mut size = [0u8; 8];
                    size.copy_from_slice(&body[2..10]);
                    export_info = Some((
                        u64::from_be_bytes(size),
                        u16::from_be_bytes([body[10], body[11]]),
                    ));
                }
            }
            NBD_REP_ERR_TLS_REQD => bail!("{NEEDS_CERT}"),
            NBD_REP_ERR_UNKNOWN => bail!("no such export"),
            t if t & NBD_REP_FLAG_ERROR != 0 => bail!(
                "the server refused it: {}",
                String::from_utf8_lossy(&body).trim()
            ),
            t => bail!("unexpected option reply type {t}"),
        }
    }
    let Some((size, flags)) = export_info else {
        bail!("the server did not say the export's size");
    };
    Ok((s, size, flags))
}

/// One reply to option `opt`: its type and data.
async fn read_reply(s: &mut Box<dyn Stream>, opt: u32) -> Result<(u32, Vec<u8>)> {
    if s.read_u64().await? != OPT_REPLY_MAGIC {
        bail!("bad option reply magic");
    }
    let got = s.read_u32().await?;
    if got != opt {
        bail!("a reply to option {got} came for option {opt}");
    }
    let ty = s.read_u32().await?;
    let len = s.read_u32().await? as usize;
    if len > MAX_OPTION_REPLY {
        bail!("option reply of {len} bytes");
    }
    let mut body = vec![0; len];
    s.read_exact(&mut body).await?;
    Ok((ty, body))
}

/// The name of an NBD error number.
fn errno_name(e: u32) -> String {
    match e {
        NBD_EPERM => "EPERM (not permitted: read-only, or another node writes it)".to_string(),
        NBD_EIO => "EIO (the data could not be read or stored)".to_string(),
        NBD_ENOMEM => "ENOMEM".to_string(),
        NBD_EINVAL => "EINVAL (a bad request)".to_string(),
        NBD_ENOSPC => "ENOSPC (no space left)".to_string(),
        NBD_EOVERFLOW => "EOVERFLOW".to_string(),
        NBD_ENOTSUP => "ENOTSUP".to_string(),
        NBD_ESHUTDOWN => "ESHUTDOWN (the server is shutting down)".to_string(),
        e => format!("error {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_errno_names_say_what_happened() {
        assert!(errno_name(NBD_EPERM).starts_with("EPERM"));
        assert!(errno_name(NBD_ENOSPC).starts_with("ENOSPC"));
        assert_eq!(errno_name(77), "error 77");
    }
}
