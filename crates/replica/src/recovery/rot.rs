//! A copy known current whose blocks rotted (a scrub's find): its rotten blocks
//! are rewritten from copies known current, and it stays; it is not replaced whole.
use drove_placement::locate_vdi;
use drove_proto::{PeerReq, PeerResp};
use drove_types::{Epoch, NodeId, NodeState, ObjectId, Result, WritePolicy, BLOCK_SIZE};

use crate::local::{blocking, DigestBy};

use super::Recoverer;

impl Recoverer {
    /// Recover this node's copy of `oid`, whose data a read found rotten under
    /// its checksums (a scrub): the copies are compared by reading them. Compared
    /// by checksums, the rotten copy looks as good as the others (the rot is under
    /// them) and was kept (e2e_heal's scrub tests: `repaired=1`, and the byte
    /// still flipped).
    ///
    /// The copy is read again once the slot is this call's: a recovery that
    /// compared by checksums may have had it first and marked the copy current,
    /// its rot unseen, and this call then returned at once, the copy still rotten,
    /// and the scrub counted it repaired (`drove sim faults --seed 1628 --time
    /// 40s`: node 3 was catching up when it scrubbed).
    ///
    /// A copy known current until the rot was found first has its rotten blocks
    /// rewritten from copies known current ([`Recoverer::mend_rot`]) and stays.
    /// Replaced whole by another copy, it could lose a write it had taken that was
    /// still on its way to the other copy when that copy was fetched: the replica
    /// serving the fetch has no way to know of it (found by code review; the
    /// simulator's disks serve each replica's requests in order, so it does not
    /// show there). Only when that fails is the copy recovered as any other.
    pub(crate) async fn recover_rotten(&self, oid: ObjectId, len: u32) -> Result<()> {
        let slot = self.slot(oid);
        let _one = slot.lock().await;
        if !self
            .local
            .digest(oid, len, DigestBy::Reading)
            .await?
            .corrupt
        {
            return Ok(());
        }
        let cu = self.local.catchup();
        let was_current = cu.is_current(oid);
        cu.mark_pending(oid);
        if was_current
            && self.mend_rot(oid, len).await
            && !self
                .local
                .digest(oid, len, DigestBy::Reading)
                .await?
                .corrupt
        {
            cu.mark_current(oid);
            return Ok(());
        }
        self.recover_by(oid, false, DigestBy::Reading).await
    }

    /// Rewrite every rotten block of this node's copy of `oid` with the same block
    /// of a copy of its version known current (one in the VDI's home zone, for a
    /// zone-sync VDI: a copy outside it lags). The caller holds the object's slot
    /// and made the copy pending, so writes to it wait; those taken before are
    /// done once its digest is taken here (by checksums: only its version is
    /// wanted, and the caller read it whole already). False, with nothing written, when a
    /// block has no such copy to come from, or this copy lies outside the home
    /// zone of a zone-sync VDI: the copy is then recovered as any other.
    async fn mend_rot(&self, oid: ObjectId, len: u32) -> bool {
        let view = self.view();
        let Some(vdi) = view.vdis.get(&oid.vdi) else {
            return false;
        };
        let mine = match self.local.digest(oid, len, DigestBy::Checksums).await {
            Ok(d) if d.present => d,
            _ => return false,
        };
        let at = Epoch(mine.version.epoch);
        let zone_sync = vdi.policy == WritePolicy::ZoneSync;
        let trusted = |n: NodeId| !zone_sync || view.in_home(vdi, n, at);
        if !trusted(self.me) {
            return false;
        }
        let others: Vec<NodeId> = locate_vdi(&view.map, vdi, oid)
            .into_iter()
            .filter(|&n| {
                n != self.me
                    && trusted(n)
                    && view.map.node(n).is_some_and(|x| x.state == NodeState::Up)
            })
            .collect();
        let epoch = view.map.epoch;
        let sources: Vec<NodeId> = self
            .digests_of(&others, oid, len, epoch, DigestBy::Checksums)
            .await
            .into_iter()
            .filter(|(_, d)| d.present && d.current && d.version == mine.version)
            .map(|(n, _)| n)
            .collect();
        if sources.is_empty() {
            return false;
        }
        let Ok(rotten) = self.rotten_blocks(oid, len).await else {
            return false;
        };
        let mut got = Vec::with_capacity(rotten.len());
        for b in rotten {
            let mut found = None;
            for &n in &sources {
                let req = PeerReq::MendRead {
                    oid,
                    offset: b * BLOCK_SIZE,
                    len: BLOCK_SIZE as u32,
                    epoch,
                };
                if let Ok((PeerResp::Data, data)) = self.short_call(n, req).await {
                    if data.len() as u64 == BLOCK_SIZE {
                        found = Some((n, data));
                        break;
                    }
                }
            }
            let Some((n, data)) = found else {
                tracing::info!(me = %self.me, %oid, block = b, "no copy known current holds the rotten block whole: recovering the copy");
                return false;
            };
            got.push((b, n, data));
        }
        let cu = self.local.catchup();
        let _held = cu.copy_lock(oid).await;
        let from: Vec<(u64, NodeId)> = got.iter().map(|(b, n, _)| (*b, *n)).collect();
        let written = blocking(self.local.store(), move |s| {
            for (b, _, data) in &got {
                s.write(oid, b * BLOCK_SIZE, data)?;
            }
            s.flush(&[oid])
        })
        .await;
        match written {
            Ok(()) => {
                tracing::info!(me = %self.me, %oid, blocks = ?from, "scrub: rewrote the copy's rotten blocks from copies known current (block, from)");
                true
            }
            Err(e) => {
                tracing::warn!(me = %self.me, %oid, "cannot rewrite the rotten blocks: {e}");
                false
            }
        }
    }
}
