//! Applying a peer request to this node's object store. The store is synchronous
//! (pread/pwrite/fsync), so every call runs on tokio's blocking pool.
use bytes::Bytes;
use drove_objstore::ObjectStore;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{Error, ErrorKind, Result};
use futures::future::join_all;
use std::sync::Arc;

use crate::fence::Fence;
use crate::PeerPool;

/// Writes up to this size without FUA are done on the calling task.
const INLINE_MAX: usize = 64 << 10;

/// Run `f` against the store on the blocking pool.
pub async fn blocking<T: Send + 'static>(
    store: &Arc<dyn ObjectStore>,
    f: impl FnOnce(&dyn ObjectStore) -> Result<T> + Send + 'static,
) -> Result<T> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(store.as_ref()))
        .await
        .map_err(|e| Error::new(ErrorKind::Io, format!("Store task failed: {e}")))?
}

/// This node's object store with its fence: what every request that reaches this
/// node, from a peer or from its own gateway, is applied to.
pub struct LocalStore {
    store: Arc<dyn ObjectStore>,
    fence: Fence,
}

impl LocalStore {
    /// Wrap `store`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(LocalStore {
            store,
            fence: Fence::default(),
        })
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The lock generations this node enforces.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Apply `req` (with its `payload`) here. Forwarding is not done here.
    pub async fn apply(&self, req: &PeerReq, payload: Bytes) -> Result<(PeerResp, Bytes)> {
        let store = &self.store;
        match req {
            PeerReq::Ping => Ok((PeerResp::Ok, Bytes::new())),
            &PeerReq::Read { oid, offset, len } => {
                let data = blocking(store, move |s| s.read(oid, offset, len)).await?;
                Ok((PeerResp::Data, Bytes::from(data)))
            }
            &PeerReq::Write {
                oid,
                offset,
                fua,
                generation,
                ..
            } => {
                self.fence.admit(oid.vdi, generation)?;
                if !fua && payload.len() <= INLINE_MAX {
                    // A small write without FUA lands in the page cache and takes a few
                    // microseconds; handing it to the blocking pool and back costs more
                    // than that in thread wake-ups, so it runs here. Anything that can
                    // wait on the disk (FUA, fsync, large writes) still goes to the pool.
                    store.write(oid, offset, &payload)?;
                    return Ok((PeerResp::Ok, Bytes::new()));
                }
                blocking(store, move |s| {
                    s.write(oid, offset, &payload)?;
                    if fua {
                        s.flush(&[oid])?;
                    }
                    Ok(())
                })
                .await?;
                Ok((PeerResp::Ok, Bytes::new()))
            }
            &PeerReq::WriteZeroes {
                oid,
                offset,
                len,
                fua,
                generation,
                ..
            } => {
                self.fence.admit(oid.vdi, generation)?;
                blocking(store, move |s| {
                    s.write_zeroes(oid, offset, len)?;
                    if fua {
                        s.flush(&[oid])?;
                    }
                    Ok(())
                })
                .await?;
                Ok((PeerResp::Ok, Bytes::new()))
            }
            PeerReq::Flush { oids } => {
                let oids = oids.clone();
                blocking(store, move |s| s.flush(&oids)).await?;
                Ok((PeerResp::Ok, Bytes::new()))
            }
            PeerReq::Exists { oids } => {
                let oids = oids.clone();
                let found = blocking(store, move |s| {
                    oids.iter()
                        .map(|&o| s.exists(o))
                        .collect::<Result<Vec<_>>>()
                })
                .await?;
                Ok((PeerResp::Exists(found), Bytes::new()))
            }
        }
    }
}

/// Turn a response into a result: a [`PeerResp::Err`] becomes an [`Error`].
pub fn into_result(resp: PeerResp, payload: Bytes) -> Result<(PeerResp, Bytes)> {
    match resp {
        PeerResp::Err(e) => Err(e.into()),
        other => Ok((other, payload)),
    }
}

/// Apply `req` here and, for a primary-copy write, pass it on to the nodes it names at
/// the same time; the answer is an error if this node or any of them failed. Used by
/// the peer server and by a gateway that is itself the primary.
pub async fn apply_and_forward(
    local: &LocalStore,
    pool: &PeerPool,
    req: &PeerReq,
    payload: Bytes,
) -> Result<(PeerResp, Bytes)> {
    let forward = match req {
        PeerReq::Write { forward, .. } | PeerReq::WriteZeroes { forward, .. } => forward.clone(),
        _ => Vec::new(),
    };
    if forward.is_empty() {
        return local.apply(req, payload).await;
    }
    let onward = strip_forward(req);
    let remote = forward
        .iter()
        .map(|&n| pool.call(n, onward.clone(), payload.clone()));
    let (local, remote) = tokio::join!(local.apply(req, payload.clone()), join_all(remote));
    for r in remote {
        r?;
    }
    local
}

fn strip_forward(req: &PeerReq) -> PeerReq {
    let mut r = req.clone();
    match &mut r {
        PeerReq::Write { forward, .. } | PeerReq::WriteZeroes { forward, .. } => forward.clear(),
        _ => {}
    }
    r
}
