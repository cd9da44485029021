//! The transmission phase of one connection on tokio: one reader parses requests in
//! arrival order and spawns each on its own task, and one writer task sends replies in
//! completion order (the client matches them by cookie). This is what keeps a VM's
//! queue depth alive across the data path: a slow read never holds up a fast write.
//!
//! Bounds: at most `max_requests` requests and `max_buffered_bytes` of READ/WRITE
//! payload are held per connection; both are released only once the reply has been
//! written, so a client that stops reading replies stops being read too.
use crate::barrier::WriteTracker;
use crate::exec::{execute, Target};
use crate::export::Export;
use crate::handshake::Negotiated;
use crate::proto::*;
use crate::reply::Reply;
use crate::request::{Command, Request};
use crate::Limits;
use bytes::{Bytes, BytesMut};
use drove_metrics::Metrics;
use std::io;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};

/// A reply on its way to the writer, with the budget it holds until it is written.
struct Outgoing {
    reply: Reply,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// Shared by the reader and every request task of one connection.
struct Conn {
    export: Arc<dyn Export>,
    params: Negotiated,
    tracker: Arc<WriteTracker>,
    metrics: Arc<Metrics>,
}

/// Serve requests on `stream` until the client disconnects or breaks the protocol.
pub(crate) async fn run<S>(
    stream: S,
    export: Arc<dyn Export>,
    params: Negotiated,
    metrics: Arc<Metrics>,
    limits: &Limits,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(64 << 10, rd);
    let (tx, rx) = mpsc::unbounded_channel();
    let writer_failed = Arc::new(Notify::new());
    let writer = tokio::spawn(write_loop(wr, rx, Arc::clone(&writer_failed)));
    let conn = Arc::new(Conn {
        export,
        params,
        tracker: WriteTracker::new(),
        metrics,
    });
    let budget = Budget::new(limits);
    let read = read_loop(&mut rd, &conn, &tx, &budget, &writer_failed).await;
    // Every request task holds a sender; the writer ends once all of them have queued
    // their reply and this one is gone. So waiting for it also waits for in-flight
    // requests, which DISC requires ("handle all outstanding requests").
    drop(tx);
    let written = match writer.await {
        Ok(r) => r,
        Err(e) => Err(io::Error::other(format!("reply writer task failed: {e}"))),
    };
    read.and(written)
}

/// Per-connection admission limits.
struct Budget {
    slots: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_bytes: u32,
}

impl Budget {
    fn new(l: &Limits) -> Self {
        let slots = l.max_requests.clamp(1, Semaphore::MAX_PERMITS);
        let max_bytes = u32::try_from(l.max_buffered_bytes)
            .unwrap_or(u32::MAX)
            .max(1);
        Budget {
            slots: Arc::new(Semaphore::new(slots)),
            bytes: Arc::new(Semaphore::new(max_bytes as usize)),
            max_bytes,
        }
    }

    async fn slot(&self) -> io::Result<OwnedSemaphorePermit> {
        Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(io::Error::other)
    }

    /// Reserve buffer space for `n` payload bytes; a request larger than the whole
    /// budget takes all of it rather than wait forever.
    async fn bytes(&self, n: u32) -> io::Result<Option<OwnedSemaphorePermit>> {
        if n == 0 {
            return Ok(None);
        }
        let permits = n.min(self.max_bytes);
        let p = Arc::clone(&self.bytes).acquire_many_owned(permits).await;
        p.map(Some).map_err(io::Error::other)
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    rd: &mut R,
    conn: &Arc<Conn>,
    tx: &mpsc::UnboundedSender<Outgoing>,
    budget: &Budget,
    writer_failed: &Notify,
) -> io::Result<()> {
    loop {
        let mut hdr = [0u8; REQUEST_LEN];
        let more = tokio::select! {
            r = read_frame(rd, &mut hdr) => r?,
            _ = writer_failed.notified() => {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "cannot send replies"));
            }
        };
        if !more {
            return Ok(()); // The client closed between requests (without DISC).
        }
        let req = Request::decode(&hdr).map_err(|m| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad request magic {:#010x}", m.0),
            )
        })?;
        let start = Instant::now();
        if req.command == Command::Disc {
            conn.metrics.nbd_op(Command::Disc.name(), 0, 0.0, true);
            return Ok(());
        }
        let slot = budget.slot().await?;
        if let Err(errno) = req.check(&conn.params) {
            // The payload of a refused WRITE is still on the wire: skip it to stay in
            // sync, without buffering it.
            discard(rd, req.payload_len()).await?;
            let msg = match errno {
                NBD_ENOSPC => "write beyond the end of the export",
                _ => "invalid request: bad command, flags, length or range",
            };
            let reply = Reply::error(req.cookie, conn.params.structured, errno, msg);
            let secs = start.elapsed().as_secs_f64();
            conn.metrics.nbd_op(req.command.name(), 0, secs, false);
            let _ = tx.send(Outgoing {
                reply,
                _slot: slot,
                _bytes: None,
            });
            continue;
        }
        let buffered = match req.command {
            Command::Read | Command::Write => req.length,
            _ => 0,
        };
        let bytes = budget.bytes(buffered).await?;
        let payload = read_payload(rd, req.payload_len()).await?;
        // Registered here, in arrival order, so a FLUSH read after this line waits for
        // this write and one read before it does not.
        let guard = req.command.is_write().then(|| conn.tracker.begin());
        let barrier = (req.command == Command::Flush).then(|| conn.tracker.barrier());
        let conn = Arc::clone(conn);
        let tx = tx.clone();
        tokio::spawn(async move {
            let target = Target {
                export: conn.export.as_ref(),
                params: &conn.params,
                tracker: &conn.tracker,
            };
            let (reply, ok) = execute(&target, &req, payload, barrier).await;
            drop(guard);
            let moved = if ok { u64::from(buffered) } else { 0 };
            let secs = start.elapsed().as_secs_f64();
            conn.metrics.nbd_op(req.command.name(), moved, secs, ok);
            // Fails only when the writer has died; the connection is closing then.
            let _ = tx.send(Outgoing {
                reply,
                _slot: slot,
                _bytes: bytes,
            });
        });
    }
}

/// Fill `buf` with the next request header. `Ok(false)` on a clean end of stream
/// before its first byte; a header cut short is an error.
async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        let n = rd.read(rest).await?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated request header",
            ));
        }
        got += n;
    }
    Ok(true)
}

async fn read_payload<R: AsyncRead + Unpin>(rd: &mut R, len: u32) -> io::Result<Bytes> {
    let len = len as usize;
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        if (&mut *rd).take(want).read_buf(&mut buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated write payload",
            ));
        }
    }
    Ok(buf.freeze())
}

async fn discard<R: AsyncRead + Unpin>(rd: &mut R, len: u32) -> io::Result<()> {
    let copied =
        tokio::io::copy(&mut (&mut *rd).take(u64::from(len)), &mut tokio::io::sink()).await?;
    if copied < u64::from(len) {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "truncated write payload",
        ));
    }
    Ok(())
}

async fn write_loop<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    failed: Arc<Notify>,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(64 << 10, wr);
    let sent = async {
        while let Some(out) = rx.recv().await {
            write_reply(&mut w, &out.reply).await?;
            // Batch whatever else is ready into one flush.
            while let Ok(more) = rx.try_recv() {
                write_reply(&mut w, &more.reply).await?;
            }
            w.flush().await?;
        }
        Ok::<(), io::Error>(())
    }
    .await;
    if sent.is_err() {
        // notify_one keeps a permit, so the reader sees it even if not waiting yet.
        failed.notify_one();
        return sent;
    }
    // The client may already be gone after DISC; a failed shutdown changes nothing.
    let _ = w.shutdown().await;
    Ok(())
}

async fn write_reply<W: AsyncWrite + Unpin>(w: &mut W, r: &Reply) -> io::Result<()> {
    w.write_all(&r.head).await?;
    if !r.data.is_empty() {
        w.write_all(&r.data).await?;
    }
    Ok(())
}
