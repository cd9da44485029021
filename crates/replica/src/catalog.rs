//! What a replica knows of the cluster metadata, to judge the requests it gets: the
//! VDIs that exist (with their object size and copies), the lock generation each was
//! last handed, and the cluster map. The daemon publishes a new [`Catalog`] whenever
//! the metadata changes; the peer side checks every request against the latest.
//!
//! A request may run ahead of this node's metadata (a VDI created or a lock granted a
//! moment ago, applied by the leader first), so a check that fails because something
//! is *not yet known* waits a little for the next catalog before refusing. A check
//! that fails against what *is* known (a deleted VDI, an older generation) refuses
//! at once. Nothing a peer sends changes the catalog: before, the first write
//! carrying a generation raised this node's fencing bar to it, so one write with
//! generation u64::MAX fenced every real gateway of the VDI until a restart.
use drove_types::{ClusterMap, Error, ErrorKind, Result, VdiId, VdiInfo};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a request waits for this node's metadata to learn what it names.
pub const META_WAIT: Duration = Duration::from_secs(2);

/// The metadata facts a replica checks requests against.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// The cluster map.
    pub map: Arc<ClusterMap>,
    /// The VDIs (snapshots included) by id; shared with recovery's [`crate::View`]
    /// and between catalogs while the VDI table does not change.
    pub vdis: Arc<BTreeMap<VdiId, VdiInfo>>,
    /// Ids below this were handed out; the ones not in `vdis` are deleted.
    pub next_vdi_id: u32,
    /// The newest lock generation handed out per VDI (a snapshot's is `u64::MAX`:
    /// frozen, no writer at all).
    pub generations: BTreeMap<VdiId, u64>,
}

impl Catalog {
    fn vdi_now(&self, id: VdiId) -> Option<Result<VdiInfo>> {
        if let Some(v) = self.vdis.get(&id) {
            return Some(Ok(v.clone()));
        }
        (id.0 < self.next_vdi_id).then(|| {
            Err(Error::new(
                ErrorKind::Gone,
                format!("VDI id {id} was deleted"),
            ))
        })
    }

    fn generation_now(&self, vdi: VdiId, generation: u64) -> Option<Result<()>> {
        let bar = self.generations.get(&vdi).copied().unwrap_or(0);
        if generation < bar {
            let why = if bar == u64::MAX {
                format!("VDI {vdi} is a snapshot (read-only)")
            } else {
                format!("lock generation {generation} is older than {bar}: another gateway holds the lock")
            };
            return Some(Err(Error::new(
                ErrorKind::Fenced,
                format!("Write to VDI {vdi} refused: {why}"),
            )));
        }
        (generation == bar).then_some(Ok(()))
    }
}

/// The latest catalog, and a way to wait for the next.
pub struct CatalogCell {
    tx: watch::Sender<Arc<Catalog>>,
}

impl Default for CatalogCell {
    fn default() -> Self {
        CatalogCell {
            tx: watch::channel(Arc::new(Catalog::default())).0,
        }
    }
}

impl CatalogCell {
    /// Install a newer catalog and wake the requests waiting for one.
    pub fn publish(&self, catalog: Catalog) {
        self.tx.send_replace(Arc::new(catalog));
    }

    /// The latest catalog.
    pub fn get(&self) -> Arc<Catalog> {
        self.tx.borrow().clone()
    }

    /// Wait (up to [`META_WAIT`]) until `decide` gives an answer on the latest
    /// catalog; `None` means "not known yet". On timeout, `unknown()` is the answer.
    async fn decide<T>(
        &self,
        decide: impl Fn(&Catalog) -> Option<Result<T>>,
        unknown: impl FnOnce() -> Error,
    ) -> Result<T> {
        let mut rx = self.tx.subscribe();
        let deadline = tokio::time::Instant::now() + META_WAIT;
        loop {
            if let Some(r) = decide(&rx.borrow_and_update()) {
                return r;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(unknown()),
            }
        }
    }

    /// The record of VDI `id`: `Gone` when it was deleted; `Unavailable` (logged)
    /// when this node's metadata does not learn of it within [`META_WAIT`] (a forged
    /// id, or this node is behind: the gateway may then mark it down).
    pub async fn vdi(&self, id: VdiId) -> Result<VdiInfo> {
        self.decide(
            |c| c.vdi_now(id),
            || {
                tracing::warn!(vdi = %id, "refused a request for a VDI id this node's metadata does not know");
                Error::unavailable(format!(
                    "VDI id {id} is unknown here (never made, or this node's metadata is behind)"
                ))
            },
        )
        .await
    }

    /// Admit a write of `vdi` under lock `generation`: `Fenced` when a newer one was
    /// handed out; `Unavailable` (logged) for one this node's metadata does not hand
    /// out within [`META_WAIT`].
    pub async fn admit_generation(&self, vdi: VdiId, generation: u64) -> Result<()> {
        self.decide(
            |c| c.generation_now(vdi, generation),
            || {
                tracing::warn!(%vdi, generation, "refused a write with a lock generation never handed out");
                Error::unavailable(format!(
                    "Write to VDI {vdi} refused: lock generation {generation} is unknown here \
                     (never handed out, or this node's metadata is behind)"
                ))
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vdi(id: u32) -> VdiInfo {
        VdiInfo::new(VdiId(id), format!("v{id}"), 1 << 30, 4 << 20, 3)
    }

    fn catalog(live: &[u32], next: u32, gens: &[(u32, u64)]) -> Catalog {
        Catalog {
            map: Arc::default(),
            vdis: Arc::new(live.iter().map(|&i| (VdiId(i), vdi(i))).collect()),
            next_vdi_id: next,
            generations: gens.iter().map(|&(v, g)| (VdiId(v), g)).collect(),
        }
    }

    #[tokio::test]
    async fn test_deleted_and_never_made_vdis_are_gone_new_ones_are_waited_for() {
        let cell = CatalogCell::default();
        cell.publish(catalog(&[1, 3], 4, &[]));
        assert_eq!(cell.vdi(VdiId(3)).await.unwrap().id, VdiId(3));
        // Id 2 was handed out and is not in the table: deleted, refused at once.
        let t = std::time::Instant::now();
        assert_eq!(
            cell.vdi(VdiId(2)).await.unwrap_err().kind(),
            ErrorKind::Gone
        );
        assert!(t.elapsed() < Duration::from_millis(500));
        // Id 4 is not known yet: the request waits for the metadata that makes it.
        let later = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cell.publish(catalog(&[1, 3, 4], 5, &[]));
        };
        let (got, ()) = tokio::join!(cell.vdi(VdiId(4)), later);
        assert_eq!(got.unwrap().id, VdiId(4));
    }

    #[tokio::test(start_paused = true)]
    async fn test_an_id_never_handed_out_is_refused_after_the_wait() {
        let cell = CatalogCell::default();
        cell.publish(catalog(&[1], 2, &[]));
        let e = cell.vdi(VdiId(0xdead)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn test_generations_fence_older_writers_and_refuse_forged_newer_ones() {
        let cell = CatalogCell::default();
        cell.publish(catalog(&[1, 2], 3, &[(1, 4), (2, u64::MAX)]));
        cell.admit_generation(VdiId(1), 4).await.unwrap();
        let e = cell.admit_generation(VdiId(1), 3).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
        let e = cell.admit_generation(VdiId(2), 7).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Fenced, "a snapshot: {e}");
        // A generation the metadata never handed out is refused, and the bar stays:
        // the real holder (4) still writes.
        let e = cell.admit_generation(VdiId(1), u64::MAX).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        cell.admit_generation(VdiId(1), 4).await.unwrap();
        // A generation granted a moment ago is admitted once this node applies it.
        let later = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cell.publish(catalog(&[1, 2], 3, &[(1, 5), (2, u64::MAX)]));
        };
        let (got, ()) = tokio::join!(cell.admit_generation(VdiId(1), 5), later);
        got.unwrap();
        assert_eq!(
            cell.admit_generation(VdiId(1), 4).await.unwrap_err().kind(),
            ErrorKind::Fenced
        );
    }
}
