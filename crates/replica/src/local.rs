//! Applying a peer request to this node's object store. The store is synchronous
//! (pread/pwrite/fsync), so every call runs on tokio's blocking pool.
use bytes::Bytes;
use drove_objstore::ObjectStore;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{Error, ErrorKind, Result};
use std::sync::Arc;

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

/// Apply `req` (with its `payload`) to the local store. Forwarding is not done here.
pub async fn apply(
    store: &Arc<dyn ObjectStore>,
    req: &PeerReq,
    payload: Bytes,
) -> Result<(PeerResp, Bytes)> {
    match req {
        PeerReq::Ping => Ok((PeerResp::Ok, Bytes::new())),
        &PeerReq::Read { oid, offset, len } => {
            let data = blocking(store, move |s| s.read(oid, offset, len)).await?;
            Ok((PeerResp::Data, Bytes::from(data)))
        }
        &PeerReq::Write {
            oid, offset, fua, ..
        } => {
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
            ..
        } => {
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

/// Turn a response into a result: a [`PeerResp::Err`] becomes an [`Error`].
pub fn into_result(resp: PeerResp, payload: Bytes) -> Result<(PeerResp, Bytes)> {
    match resp {
        PeerResp::Err(e) => Err(e.into()),
        other => Ok((other, payload)),
    }
}
