//! Mending a copy in place (its rotten blocks rewritten from other copies of its
//! version), and the [`Repair`] hooks the catch-up code calls: recover an
//! object on demand, confirm or learn that a copy is absent, repair from a node.
use drove_proto::{ObjDigest, PeerReq, PeerResp};
use drove_types::{Epoch, Error, ErrorKind, NodeId, ObjectId, Result, BLOCK_SIZE};
use futures::future::BoxFuture;
use std::collections::HashSet;

use crate::catchup::Repair;
use crate::local::{blocking, DigestBy};

use super::plan::mend_order;
use super::{Recoverer, ABSENT_KEPT};

impl Recoverer {
    /// Rewrite the blocks of this node's copy of `oid` that fail their checksums
    /// with the same blocks of other copies of its version (see [`mend_order`]),
    /// keeping its version; whether every rotten block was mended. The caller
    /// holds the object's slot and the copy is pending, so writes to it wait.
    /// `alone`: the copy is the only one of the latest version on a host that lost
    /// power ([`Recoverer::alone_in_version`]); every failing block is sealed.
    pub(super) async fn mend(
        &self,
        oid: ObjectId,
        len: u32,
        mine: &ObjDigest,
        others: &[(NodeId, ObjDigest)],
        alone: bool,
        near: &(dyn Fn(NodeId, Epoch) -> bool + Sync),
    ) -> bool {
        let order = mend_order(mine, others, near);
        // A home copy whose host lost power: a block failing here is most likely a
        // write the power loss cut, and the far copy of the same version may lack
        // even the write before it, acknowledged durable. When every other home copy
        // asked fails the block too, it is sealed as it stands rather than taken
        // from the far copy: taken from there, both home copies torn at one block
        // after the whole site lost power, write 1382 was replaced by the far
        // copy's 1233 everywhere (`drove sim faults --seed 1306 --time 20s --meta
        // raft`). A home copy that cannot answer (its disk failed) leaves the far
        // copy as the fallback: refused it, a home copy with one block flipped was
        // replaced whole by the far copy, short of two durable writes (`--seed
        // 3016`).
        let at = Epoch(mine.version.epoch);
        let seal_before_far = self.local.catchup().lost_unflushed_in(oid) && near(self.me, at);
        if order.is_empty() && !alone {
            return false;
        }
        let rotten = match self.rotten_blocks(oid, len).await {
            Ok(r) if !r.is_empty() => r,
            Ok(_) => return false,
            Err(e) => {
                tracing::warn!(me = %self.me, %oid, "cannot read the copy to mend it: {e}");
                return false;
            }
        };
        let epoch = self.view().map.epoch;
        let mut got = Vec::with_capacity(rotten.len());
        let mut sealed = Vec::new();
        for b in rotten {
            let mut found = None;
            // Whether every other copy of the version fails this block too.
            let mut torn_everywhere = true;
            // Other home copies that fail the block as torn.
            let mut torn_home = 0;
            for &n in &order {
                if seal_before_far && torn_everywhere && torn_home > 0 && !near(n, at) {
                    break;
                }
                // Whatever the copy's state: after a whole-site power loss every
                // copy is pending, and a plain read of one is refused. A node of
                // wire version 4 has no MendRead: the pool sends it the plain read
                // it knows (PeerReq::in_version), which its pending copy refuses.
                let req = PeerReq::MendRead {
                    oid,
                    offset: b * BLOCK_SIZE,
                    len: BLOCK_SIZE as u32,
                    epoch,
                };
                match self.short_call(n, req).await {
                    Ok((PeerResp::Data, data)) if data.len() as u64 == BLOCK_SIZE => {
                        found = Some((n, data));
                        break;
                    }
                    Ok(_) => torn_everywhere = false,
                    Err(e) => {
                        let torn = e.kind() == ErrorKind::Corrupt;
                        torn_everywhere &= torn;
                        torn_home += usize::from(torn && near(n, at));
                        tracing::debug!(me = %self.me, %oid, node = %n, block = b, "no block to mend with: {e}")
                    }
                }
            }
            let Some((n, data)) = found else {
                if torn_everywhere {
                    // Every copy fails the block: a power loss of their nodes kept a
                    // write's data or its checksum from every disk (they are written
                    // one after the other and synced by the flush that follows; the
                    // write was not acknowledged durable). Rot does not strike every
                    // copy of a block at once. The block is sealed as this copy holds
                    // it: the old write, the new one, or a mix of the two by sector
                    // (the disk tears an unflushed write there), what a client may
                    // read of a disk after losing an unflushed write. The other copies
                    // then mend from this one, or are replaced by the copy recovery
                    // picks. So too when this copy is `alone` in its version (no
                    // copy to ask): the copies of earlier versions lack the write;
                    // and when every home copy asked fails it (`seal_before_far`).
                    sealed.push(b);
                    continue;
                }
                tracing::warn!(me = %self.me, %oid, block = b, "no copy of the version holds the block whole: not mended");
                return false;
            };
            got.push((b, n, data));
        }
        let cu = self.local.catchup();
        let _held = cu.copy_lock(oid).await;
        let from: Vec<(u64, NodeId)> = got.iter().map(|(b, n, _)| (*b, *n)).collect();
        let resealed = sealed.clone();
        let written = blocking(self.local.store(), move |s| {
            for (b, _, data) in &got {
                s.write(oid, b * BLOCK_SIZE, data)?;
            }
            for b in &resealed {
                let data = s.read_unverified(oid, *b)?;
                s.write(oid, b * BLOCK_SIZE, &data)?;
            }
            s.flush(&[oid])
        })
        .await;
        match written {
            Ok(()) => {
                if !from.is_empty() {
                    tracing::info!(me = %self.me, %oid, blocks = ?from, "recovery: mended the copy's rotten blocks (block, from)");
                }
                if !sealed.is_empty() {
                    tracing::warn!(me = %self.me, %oid, blocks = ?sealed, "recovery: every copy of the version fails these blocks, as a write cut by a power loss leaves them: sealed as this copy holds them");
                }
                true
            }
            Err(e) => {
                tracing::warn!(me = %self.me, %oid, "cannot mend the copy: {e}");
                false
            }
        }
    }
}

impl Recoverer {
    /// The blocks of this node's copy of `oid` (`len` bytes) that fail their checksums.
    pub(super) async fn rotten_blocks(&self, oid: ObjectId, len: u32) -> Result<Vec<u64>> {
        let blocks = u64::from(len) / BLOCK_SIZE;
        blocking(self.local.store(), move |s| {
            let mut bad = Vec::new();
            for b in 0..blocks {
                match s.read(oid, b * BLOCK_SIZE, BLOCK_SIZE as u32) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Corrupt => bad.push(b),
                    Err(e) => return Err(e),
                }
            }
            Ok(bad)
        })
        .await
    }

    fn note_absent(&self, epoch: Epoch, oid: ObjectId) {
        let mut a = self.absent.lock();
        if a.0 != epoch {
            *a = (epoch, HashSet::new());
        }
        if a.1.len() < ABSENT_KEPT {
            a.1.insert(oid);
        }
    }
}

impl Repair for Recoverer {
    fn repair(&self, oid: ObjectId) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.recover(oid, false))
    }

    fn absence_known(&self, oid: ObjectId, at: Epoch) -> bool {
        let view = self.view();
        let epoch = view.map.epoch;
        if epoch != at {
            return false;
        }
        {
            let a = self.absent.lock();
            if a.0 == epoch && a.1.contains(&oid) {
                return true;
            }
        }
        // A host that lost power since its last clean epoch may have lost a copy
        // it had not flushed (one recovery wrote, or one created by a write not
        // yet flushed): until it is clean again its "nothing here" says nothing,
        // and the object is recovered first (a read of it here would otherwise
        // answer zeros for writes another copy has). Asked before the walk over
        // the epoch history below, which it makes moot.
        if self.local.catchup().lost_unflushed() || view.absence_unsure(self.me, oid) {
            return false;
        }
        self.note_absent(epoch, oid);
        true
    }

    fn confirm_absent(&self, oid: ObjectId, at: Epoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let epoch = self.view().map.epoch;
            if epoch > at {
                return Err(Error::new(
                    ErrorKind::StaleEpoch,
                    format!(
                        "Request from epoch {at}; this node is at epoch {epoch}, on whose \
                         map it answers for its absent copy of object {oid}"
                    ),
                ));
            }
            if self.absence_known(oid, epoch) {
                return Ok(());
            }
            tracing::debug!(me = %self.me, %oid, "no copy here and a node that held it is down: recovering it first");
            self.local.catchup().mark_pending(oid);
            self.recover(oid, false).await?;
            self.note_absent(epoch, oid);
            Ok(())
        })
    }

    fn repair_from(&self, oid: ObjectId, len: u32, from: NodeId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if from == self.me {
                // This copy is to win: one not known current is recovered first, as
                // any would be. Marked current as it stood, it once replaced the
                // copies of nodes that took later writes and were not asked
                // (`drove sim faults --seed 672 --time 40s`). One that fails its
                // checksums is recovered as a scrub's would be, its rotten blocks
                // mended from the other copies: known current, it was left as it
                // was.
                let d = self.local.digest(oid, len, DigestBy::Reading).await?;
                if d.corrupt {
                    return self.recover_rotten(oid, len).await;
                }
                return self.recover(oid, false).await;
            }
            let slot = self.slot(oid);
            let _one = slot.lock().await;
            self.copy(oid, len, from, true, false).await
        })
    }
}
