//! Running one checked transmission request against the [`Export`]: the step where the
//! NBD frontend hands an I/O to the volume layer and turns the result into a reply.
//! Called on its own task per request, so requests of one connection overlap.
use crate::barrier::{Barrier, WriteTracker};
use crate::errno::errno_for;
use crate::export::Export;
use crate::handshake::Negotiated;
use crate::proto::*;
use crate::reply::{descriptors, Reply};
use crate::request::{Command, Request};
use bytes::Bytes;
use drove_types::Error;

/// What a request runs against.
pub(crate) struct Target<'a> {
    /// The export.
    pub export: &'a dyn Export,
    /// The negotiated parameters.
    pub params: &'a Negotiated,
    /// The connection's flush barrier.
    pub tracker: &'a WriteTracker,
}

/// Run `req` (already checked) with its WRITE `payload`; a FLUSH carries the `barrier`
/// taken when it arrived. Returns the reply and whether the request succeeded.
pub(crate) async fn execute(
    t: &Target<'_>,
    req: &Request,
    payload: Bytes,
    barrier: Option<Barrier>,
) -> (Reply, bool) {
    let structured = t.params.structured;
    match run(t, req, payload, barrier).await {
        Ok(reply) => (reply, true),
        Err(e) => {
            warn_failed(req, &e);
            (
                Reply::error(req.cookie, structured, errno_for(e.kind()), &e.to_string()),
                false,
            )
        }
    }
}

/// The second (since the epoch) of the last failed-request warning.
static LAST_WARNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Log a request the client gets an error for: what the guest sees as EIO must be
/// in the node's log with its cause. At most one a second per process (a failing
/// disk fails every request); the rest show in the NBD metrics.
fn warn_failed(req: &Request, e: &Error) {
    use std::sync::atomic::Ordering::Relaxed;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_WARNED.load(Relaxed);
    if now > last
        && LAST_WARNED
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_ok()
    {
        tracing::warn!(
            command = ?req.command,
            offset = req.offset,
            length = req.length,
            errno = errno_for(e.kind()),
            "nbd request failed: {e}"
        );
    }
}

async fn run(
    t: &Target<'_>,
    req: &Request,
    payload: Bytes,
    barrier: Option<Barrier>,
) -> drove_types::Result<Reply> {
    let (off, len, fua) = (req.offset, req.length, req.fua());
    let export = t.export;
    match req.command {
        Command::Read => {
            let data = if len == 0 {
                Bytes::new()
            } else {
                export.read(off, len).await?
            };
            // A reply's length is fixed by the request; a backend that returns another
            // length would desynchronise the stream, so it becomes an error instead.
            if data.len() != len as usize {
                return Err(Error::new(
                    drove_types::ErrorKind::Io,
                    format!(
                        "backend returned {} bytes for a {len}-byte read",
                        data.len()
                    ),
                ));
            }
            Ok(Reply::read(req.cookie, t.params.structured, off, data))
        }
        Command::Write => {
            if len > 0 {
                export.write(off, payload, fua).await?;
            }
            Ok(Reply::ok(req.cookie))
        }
        Command::WriteZeroes => {
            // NO_HOLE may be ignored by the protocol's leave (the area reads as zeroes
            // either way) and FAST_ZERO is accepted: the volume layer zeroes by
            // dropping or marking objects, never by writing zero buffers.
            if len > 0 {
                export.write_zeroes(off, len, fua).await?;
            }
            Ok(Reply::ok(req.cookie))
        }
        Command::Trim => {
            if len > 0 {
                export.trim(off, len).await?;
                // Export::trim has no FUA; a flush gives the same durability.
                if fua {
                    export.flush().await?;
                }
            }
            Ok(Reply::ok(req.cookie))
        }
        Command::Flush => {
            if let Some(b) = barrier {
                t.tracker.wait(b).await;
            }
            export.flush().await?;
            Ok(Reply::ok(req.cookie))
        }
        // A hint only; the protocol allows doing nothing.
        Command::Cache => Ok(Reply::ok(req.cookie)),
        Command::BlockStatus => {
            let ctx = t
                .params
                .meta_context
                .ok_or_else(|| Error::invalid("no metadata context negotiated"))?;
            let extents = export.block_status(off, len).await?;
            let req_one = req.flags & NBD_CMD_FLAG_REQ_ONE != 0;
            Ok(Reply::block_status(
                req.cookie,
                ctx,
                &descriptors(&extents, len, req_one),
            ))
        }
        Command::Disc | Command::Unknown(_) => Err(Error::invalid("command not executable")),
    }
}
