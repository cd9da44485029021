//! A minimal NBD client for protocol tests. It decodes replies by itself, from the
//! protocol document, rather than with the server's own reply code.
use drove_nbd::option::encode_option;
use drove_nbd::proto::*;
use drove_nbd::request::{Command, Request};
use std::collections::HashMap;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One reply message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rep {
    /// Simple reply (with read data when error is 0 for a read).
    Simple {
        cookie: u64,
        error: u32,
        data: Vec<u8>,
    },
    /// One structured chunk.
    Chunk {
        flags: u16,
        ty: u16,
        cookie: u64,
        payload: Vec<u8>,
    },
}

impl Rep {
    pub fn cookie(&self) -> u64 {
        match self {
            Rep::Simple { cookie, .. } | Rep::Chunk { cookie, .. } => *cookie,
        }
    }

    /// The error carried, 0 on success.
    pub fn error(&self) -> u32 {
        match self {
            Rep::Simple { error, .. } => *error,
            Rep::Chunk { ty, payload, .. } if ty & 0x8000 != 0 => {
                u32::from_be_bytes(payload[..4].try_into().unwrap())
            }
            Rep::Chunk { .. } => 0,
        }
    }
}

pub struct Client<S> {
    pub s: S,
    pub size: u64,
    pub flags: u16,
    structured: bool,
    reads: HashMap<u64, usize>,
}

/// An option reply `(type, data)`.
pub async fn read_opt_reply<S: AsyncRead + Unpin>(s: &mut S) -> io::Result<(u32, Vec<u8>)> {
    assert_eq!(s.read_u64().await?, 0x0003_e889_0455_65a9);
    let _opt = s.read_u32().await?;
    let ty = s.read_u32().await?;
    let len = s.read_u32().await? as usize;
    let mut d = vec![0; len];
    s.read_exact(&mut d).await?;
    Ok((ty, d))
}

/// Read the greeting and send client flags.
pub async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> io::Result<()> {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).await?;
    assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
    assert_eq!(&g[16..], &[0, 3]);
    s.write_all(&3u32.to_be_bytes()).await
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// Handshake with NBD_OPT_GO, optionally negotiating structured replies and
    /// `base:allocation` first.
    pub async fn go(mut s: S, export: &str, structured: bool, meta: bool) -> io::Result<Self> {
        greet(&mut s).await?;
        Self::go_greeted(s, export, structured, meta).await
    }

    /// [`Client::go`] on a stream whose greeting was already exchanged (after STARTTLS).
    pub async fn go_greeted(
        mut s: S,
        export: &str,
        structured: bool,
        meta: bool,
    ) -> io::Result<Self> {
        if structured {
            s.write_all(&encode_option(NBD_OPT_STRUCTURED_REPLY, &[]))
                .await?;
            assert_eq!(read_opt_reply(&mut s).await?.0, NBD_REP_ACK);
        }
        if meta {
            let mut d = (export.len() as u32).to_be_bytes().to_vec();
            d.extend_from_slice(export.as_bytes());
            d.extend_from_slice(&1u32.to_be_bytes());
            d.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
            d.extend_from_slice(BASE_ALLOCATION.as_bytes());
            s.write_all(&encode_option(NBD_OPT_SET_META_CONTEXT, &d))
                .await?;
            assert_eq!(read_opt_reply(&mut s).await?.0, NBD_REP_META_CONTEXT);
            assert_eq!(read_opt_reply(&mut s).await?.0, NBD_REP_ACK);
        }
        let mut d = (export.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&encode_option(NBD_OPT_GO, &d)).await?;
        let (mut size, mut flags) = (0, 0);
        loop {
            let (ty, d) = read_opt_reply(&mut s).await?;
            match ty {
                NBD_REP_INFO if d[..2] == [0, 0] => {
                    size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes(d[10..12].try_into().unwrap());
                }
                NBD_REP_INFO => {}
                NBD_REP_ACK => break,
                other => {
                    let msg = String::from_utf8_lossy(&d).into_owned();
                    return Err(io::Error::other(format!("GO failed: {other:#x} {msg}")));
                }
            }
        }
        Ok(Client {
            s,
            size,
            flags,
            structured,
            reads: HashMap::new(),
        })
    }

    /// Handshake with NBD_OPT_EXPORT_NAME (simple replies only).
    pub async fn export_name(mut s: S, export: &str) -> io::Result<Self> {
        greet(&mut s).await?;
        s.write_all(&encode_option(NBD_OPT_EXPORT_NAME, export.as_bytes()))
            .await?;
        let size = s.read_u64().await?;
        let flags = s.read_u16().await?;
        Ok(Client {
            s,
            size,
            flags,
            structured: false,
            reads: HashMap::new(),
        })
    }

    pub async fn send(
        &mut self,
        cmd: Command,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<()> {
        if cmd == Command::Read {
            self.reads.insert(cookie, length as usize);
        }
        let r = Request {
            flags,
            command: cmd,
            cookie,
            offset,
            length,
        };
        self.s.write_all(&r.encode()).await?;
        self.s.write_all(payload).await?;
        self.s.flush().await
    }

    pub async fn recv(&mut self) -> io::Result<Rep> {
        let magic = self.s.read_u32().await?;
        match magic {
            NBD_SIMPLE_REPLY_MAGIC => {
                let error = self.s.read_u32().await?;
                let cookie = self.s.read_u64().await?;
                let is_read = self.reads.contains_key(&cookie);
                assert!(
                    !(self.structured && is_read),
                    "simple reply to a structured READ"
                );
                let len = self.reads.remove(&cookie).unwrap_or(0);
                let mut data = vec![0; if error == 0 { len } else { 0 }];
                self.s.read_exact(&mut data).await?;
                Ok(Rep::Simple {
                    cookie,
                    error,
                    data,
                })
            }
            NBD_STRUCTURED_REPLY_MAGIC => {
                assert!(self.structured, "structured chunk without negotiation");
                let flags = self.s.read_u16().await?;
                let ty = self.s.read_u16().await?;
                let cookie = self.s.read_u64().await?;
                let len = self.s.read_u32().await? as usize;
                let mut payload = vec![0; len];
                self.s.read_exact(&mut payload).await?;
                if flags & NBD_REPLY_FLAG_DONE != 0 {
                    self.reads.remove(&cookie);
                }
                Ok(Rep::Chunk {
                    flags,
                    ty,
                    cookie,
                    payload,
                })
            }
            other => panic!("bad reply magic {other:#x}"),
        }
    }
}
