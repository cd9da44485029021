//! One object's recovery: find the current copy among the replicas (by their
//! block checksums, or by reading them when a checksum lies) and copy it here,
//! or mend this node's copy in place ([`super::mend`]).
use bytes::Bytes;
use drove_placement::locate_vdi;
use drove_proto::{ObjDigest, PeerReq, PeerResp};
use drove_types::{Epoch, Error, ErrorKind, NodeId, NodeState, ObjectId, Result, WritePolicy};
use futures::future::join_all;
use tokio::time::Instant;

use crate::local::{blocking, DigestBy};

use super::plan::{as_sources, pick_source, vouches};
use super::{Recoverer, View};

impl Recoverer {
    /// Make this node's copy of `oid` current (one copy of an object at a time).
    ///
    /// The copies are compared by their block checksums, not read: a node coming
    /// back from a crash holds thousands of copies, nearly all as good as the
    /// others', and reading each on every replica to say so (the digest used to
    /// read and checksum the whole object) made its return read three times what
    /// it held (`drove sim dc-loss --return-after 60s`). A source whose data
    /// fails its checksums when sent is found then, and the choice is made again
    /// with digests that read every copy, which see it corrupt.
    pub(crate) async fn recover(&self, oid: ObjectId, limited: bool) -> Result<()> {
        let slot = self.slot(oid);
        let _one = slot.lock().await;
        match self.recover_by(oid, limited, DigestBy::Checksums).await {
            Err(e) if e.kind() == ErrorKind::Corrupt => {
                tracing::info!(me = %self.me, %oid, "recovery: a copy failed its checksums, comparing the copies again by reading them: {e}");
                self.recover_by(oid, limited, DigestBy::Reading).await
            }
            res => res,
        }
    }

    /// [`Recoverer::recover`] with the copies' digests taken `by` checksums or by
    /// reading them; the caller holds the object's slot.
    pub(super) async fn recover_by(
        &self,
        oid: ObjectId,
        limited: bool,
        by: DigestBy,
    ) -> Result<()> {
        let cu = self.local.catchup();
        if cu.is_current(oid) {
            return Ok(());
        }
        let view = self.view();
        let Some(vdi) = view.vdis.get(&oid.vdi) else {
            // A deleted VDI: no write can come; its objects are collected.
            cu.mark_current(oid);
            return Ok(());
        };
        let len = vdi.object_size;
        let placed = locate_vdi(&view.map, vdi, oid);
        let mut others: Vec<NodeId> = self.holders.lock().get(&oid).cloned().unwrap_or_default();
        others.extend(placed.iter().copied());
        others.retain(|&n| {
            n != self.me && view.map.node(n).is_some_and(|x| x.state == NodeState::Up)
        });
        // Current holders first, in placement order.
        others.sort_by_key(|n| placed.iter().position(|p| p == n).unwrap_or(usize::MAX));
        others.dedup();
        // A copy this node does not have at all (it gained the object): fetch it
        // from the first holder that knows its copy is current, without comparing
        // digests first (each digest reads the whole object on its holder).
        if !blocking(self.local.store(), move |s| s.exists(oid)).await? {
            // Only from a node it is placed on: another's copy no longer takes writes.
            for &src in others.iter().filter(|n| placed.contains(n)) {
                match self.copy(oid, len, src, false, limited).await {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::debug!(me = %self.me, %oid, node = %src, "direct fetch failed: {e}")
                    }
                }
            }
        }
        // Every answer counts as one (a node that dropped its copy holds no write
        // the others lack); only some are sources.
        let mut digests = self.digests_of(&others, oid, len, view.map.epoch, by).await;
        // A host that lost power since its last clean epoch (or since this copy
        // was last made current: a leftover, seed 8017) reads its own copy: a
        // write the power loss cut may have left a block whose data and checksum
        // disagree, which the checksums alone do not show. Digested by checksums,
        // such a copy, the only one of its version, was made current as it stood,
        // and every read of the block failed (e2e_power_loss, seed 639504).
        let mine_by = if cu.lost_unflushed_in(oid) {
            DigestBy::Reading
        } else {
            by
        };
        let mut mine = self.local.digest(oid, len, mine_by).await?;
        // A copy in the VDI's home zone when it took its version's writes.
        let near = |n: NodeId, at: Epoch| view.in_home(vdi, n, at);
        if mine.corrupt && mine.present {
            // Whether this copy is alone in its version is for every node placed
            // since to say, those the object has left too: unasked, node 8 (no copy,
            // placed at epoch 11 and no longer) kept node 7 from sealing its torn
            // copy, the only one of its version, and recovery never ended
            // (`drove sim faults --seed 1416 --time 20s --meta raft`).
            let since = Epoch(mine.version.epoch);
            self.ask_unasked(&view, oid, len, since, by, &mut digests)
                .await;
        }
        if mine.corrupt
            && self
                .mend(
                    oid,
                    len,
                    &mine,
                    &as_sources(&placed, digests.clone()),
                    self.alone_in_version(&view, oid, &mine, &digests),
                    &near,
                )
                .await
        {
            mine = self.local.digest(oid, len, mine_by).await?;
        }
        let stayed = |n: NodeId, at: Epoch| view.placed_throughout(oid, n, at);
        let mut source = pick_source(
            self.me,
            mine,
            &as_sources(&placed, digests.clone()),
            &near,
            &stayed,
        );
        if !matches!(source, Some((_, _, false))) {
            // Nobody's copy is known current. The best copy that answered holds every
            // acknowledged write only if, for every epoch since its last one, a node
            // that took every write of that epoch answered too ([`View::unvouched`]);
            // else wait (the pass is retried) rather than make a
            // stale copy current, which would then overwrite the newer one when its
            // node comes back. Up nodes among them that were not asked (they no
            // longer hold the object) are asked now.
            let since = |s: &Option<(NodeId, ObjDigest, bool)>| {
                s.map_or(Epoch(0), |(_, d, _)| Epoch(d.version.epoch))
            };
            if self
                .ask_unasked(&view, oid, len, since(&source), by, &mut digests)
                .await
            {
                source = pick_source(
                    self.me,
                    mine,
                    &as_sources(&placed, digests.clone()),
                    &near,
                    &stayed,
                );
            }
            // A higher version found among them only narrows the set; a current copy
            // found among them ends the question.
            // A corrupt copy of a later version than the best readable one holds
            // writes that copy lacks: it does not answer for its epochs (`drove sim
            // faults --seed 242 --time 40s`: a flipped copy of a later version
            // vouched for a source without its writes). One of the same or an
            // earlier version holds none the best copy lacks, and does.
            let best = source.map(|(n, d, _)| (n, d.version));
            let zone_sync = vdi.policy == WritePolicy::ZoneSync;
            // Whether node `n` answered with a copy that answers for its epochs'
            // writes ([`vouches`]), and whether it surely kept them: a copy whose
            // host lost power since it took writes may lack the unflushed ones.
            // This node's own, so (node 9, back from a power loss with its copy's
            // version, the peers that took the write after it down, vouched for
            // its own stale copy, made it current, and the others recovered from
            // it: `drove sim faults --seed 205`, two writes lost), and another's while that node has not been clean since it
            // started (it reports clean epoch 0 until its own recovery is done,
            // which decides for it). An epoch whose witnesses all answered, unsure
            // or not, has no better answer anywhere: waiting, after the whole site
            // lost power, nodes 2 and 3 each took an epoch's writes alone while
            // the other was down, and neither ever made its copy current
            // (`--seed 293`, also `--seed 91`).
            let answered = |n: NodeId| {
                if n == self.me {
                    return vouches(n, &mine, best, zone_sync, &near);
                }
                digests
                    .iter()
                    .any(|(m, d)| *m == n && vouches(n, d, best, zone_sync, &near))
            };
            let sure = |n: NodeId| {
                if n == self.me {
                    return !cu.lost_unflushed_in(oid);
                }
                digests
                    .iter()
                    .any(|(m, d)| *m == n && !unsure_since_boot(d))
            };
            let silent = view.unvouched_by(oid, since(&source), &answered, &sure, Some(self.me));
            if !silent.is_empty() && !matches!(source, Some((_, _, false))) {
                // Those that answered with a copy failing its checksums are asked to
                // mend it: waiting is for them, and nothing else repairs a copy
                // known current until a scrub reads it.
                let epoch = view.map.epoch;
                for (n, _) in digests
                    .iter()
                    .filter(|(n, d)| d.corrupt && silent.contains(n))
                {
                    let req = PeerReq::Repair {
                        oid,
                        len,
                        from: *n,
                        epoch,
                    };
                    if let Err(e) = self.short_call(*n, req).await {
                        tracing::debug!(me = %self.me, %oid, node = %n, "no mend: {e}");
                    }
                }
                return Err(Error::unavailable(format!(
                    "No copy of object {oid} is known current, and nodes {silent:?}, which \
                     took writes since the best copy's last one, do not answer: waiting \
                     for them"
                )));
            }
        }
        tracing::debug!(
            me = %self.me, %oid, ?placed, ?mine,
            digests = ?digests, source = ?source.map(|s| (s.0, s.2)),
            "recovery: copies compared"
        );
        let Some((src, d, force)) = source else {
            // No copy anywhere else: this one (or nothing) is all there is.
            cu.mark_current(oid);
            return Ok(());
        };
        if src == self.me || (d.crc == mine.crc && !mine.corrupt && d.present == mine.present) {
            if d.version != mine.version && src != self.me {
                // Same content: take the source's version, as a copy would.
                let v = d.version;
                let _held = cu.copy_lock(oid).await;
                blocking(self.local.store(), move |s| s.set_version(oid, v)).await?;
            }
            cu.mark_current(oid);
            return Ok(());
        }
        self.copy(oid, len, src, force, limited).await
    }

    /// Ask for their digests the up nodes `oid` was placed on since epoch `since`
    /// that are not among `digests` (nor this node): those that may have taken
    /// writes and were not asked, because the object has left them. Their answers
    /// join `digests`; whether there were any to ask.
    async fn ask_unasked(
        &self,
        view: &View,
        oid: ObjectId,
        len: u32,
        since: Epoch,
        by: DigestBy,
        digests: &mut Vec<(NodeId, ObjDigest)>,
    ) -> bool {
        let unasked: Vec<NodeId> = view
            .placed_since(oid, since)
            .into_iter()
            .filter(|&n| n != self.me && !digests.iter().any(|(m, _)| *m == n))
            .filter(|&n| view.map.node(n).is_some_and(|x| x.state == NodeState::Up))
            .collect();
        if unasked.is_empty() {
            return false;
        }
        let more = self
            .digests_of(&unasked, oid, len, view.map.epoch, by)
            .await;
        digests.extend(more);
        true
    }

    /// Whether this node's copy `mine` is the only copy of the latest version
    /// while its host lost power since its last clean epoch: every node the
    /// object was placed on since that version's epoch answered (`digests`), with
    /// an earlier version or none. A block of it failing its checksums is then as
    /// the power loss left an unflushed write (see [`Recoverer::mend`]): no other
    /// copy holds that write, and the copies of earlier versions lack it.
    fn alone_in_version(
        &self,
        view: &View,
        oid: ObjectId,
        mine: &ObjDigest,
        digests: &[(NodeId, ObjDigest)],
    ) -> bool {
        if !mine.present || !self.local.catchup().lost_unflushed_in(oid) {
            return false;
        }
        if digests
            .iter()
            .any(|(_, d)| d.present && d.version >= mine.version)
        {
            return false;
        }
        view.placed_since(oid, Epoch(mine.version.epoch))
            .into_iter()
            .all(|n| n == self.me || digests.iter().any(|(m, _)| *m == n))
    }

    pub(crate) async fn digests_of(
        &self,
        nodes: &[NodeId],
        oid: ObjectId,
        len: u32,
        epoch: Epoch,
        by: DigestBy,
    ) -> Vec<(NodeId, ObjDigest)> {
        let asks = nodes.iter().map(|&n| async move {
            let req = PeerReq::Digest {
                oids: vec![oid],
                len,
                epoch,
                read: by.to_wire(),
            };
            match self.short_call(n, req).await {
                Ok((PeerResp::Digests(d), _)) if d.len() == 1 => Some((n, d[0])),
                Ok(_) => None,
                Err(e) => {
                    tracing::debug!(me = %self.me, %oid, node = %n, "no digest: {e}");
                    None
                }
            }
        });
        join_all(asks).await.into_iter().flatten().collect()
    }

    /// Replace the local copy of `oid` with `src`'s and mark it current.
    pub(super) async fn copy(
        &self,
        oid: ObjectId,
        len: u32,
        src: NodeId,
        force: bool,
        limited: bool,
    ) -> Result<()> {
        let epoch = self.view().map.epoch;
        let req = PeerReq::Fetch {
            oid,
            len,
            epoch,
            force,
        };
        let t0 = Instant::now();
        let (resp, data) = self.pool.call(src, req, Bytes::new()).await?;
        let fetch_ms = t0.elapsed().as_millis();
        let PeerResp::Object { present, version } = resp else {
            return Err(Error::invalid(format!(
                "Node {src} sent a malformed answer for object {oid}"
            )));
        };
        if data.len() != len as usize {
            return Err(Error::invalid(format!(
                "Node {src} sent {} bytes of object {oid}, not {len}",
                data.len()
            )));
        }
        if !present {
            // "Missing" is an answer only from a node the object is placed on now. A
            // node it moved away from (a holder of an earlier listing) has dropped
            // its copy and, holding nothing, is not behind on it either: taken as a
            // source, its "missing" deleted the last good copies (found by the
            // simulator, `drove sim faults --seed 213`).
            let view = self.view();
            let placed = view
                .vdis
                .get(&oid.vdi)
                .is_some_and(|v| locate_vdi(&view.map, v, oid).contains(&src));
            if !placed {
                return Err(Error::unavailable(format!(
                    "Node {src} no longer holds object {oid}: not a source"
                )));
            }
        }
        if limited {
            self.throttle(data.len() as u64).await;
        }
        let cu = self.local.catchup();
        let _held = cu.copy_lock(oid).await;
        // Flushed before the copy counts as current, in a bulk pass too: other
        // nodes take its version as a promise of every write up to it. Flushed
        // only at the end of the pass (the disk writing it back meanwhile), a copy
        // torn by a power loss kept its version without its blocks and was chosen
        // as the source over the copies that had the writes (`drove sim faults
        // --seed 263 --time 20s --meta raft`: nodes 7 and 8, recovered without a
        // flush before the whole site lost power, replaced node 1's copy, and
        // writes acknowledged durable were gone).
        let written = blocking(self.local.store(), move |s| {
            let n = if present {
                s.replace(oid, &data, version)?
            } else {
                // Missing there, so missing here: a clone's missing object reads its
                // parent's data, an all-zero one does not.
                s.delete(oid)?;
                0
            };
            s.flush(&[oid])?;
            Ok(n)
        })
        .await?;
        cu.mark_current(oid);
        self.count(|p| p.bytes += written);
        tracing::debug!(me = %self.me, %oid, from = %src, bytes = written, fetch_ms, write_ms = t0.elapsed().as_millis() - fetch_ms, "object recovered");
        Ok(())
    }
}

/// Whether a peer's answer comes from a node that has not been clean since it
/// started, with nothing to show it kept its page cache: a copy, or the absence of
/// one, not known current, on a node whose clean epoch is 0 (a host back from a
/// power loss reports 0 until its recovery is done; so does a new node, whose
/// copies were fetched from others, and a node on a new, empty disk, whose "none
/// here" says nothing of the writes the old disk took: `drove sim faults --meta
/// raft --seed 9679 --time 20s` took such an answer as the witness of an epoch,
/// and a copy that lost a write to a power loss replaced the one copy holding it).
fn unsure_since_boot(d: &ObjDigest) -> bool {
    !d.current && d.clean_epoch == Epoch(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node not clean since it started (clean epoch 0, its copy not known
    /// current) answers unsure, with a copy or with none (seed 9679: "none here"
    /// from a new, empty disk); a clean node's answer, or a copy known current, is
    /// sure.
    #[test]
    fn test_an_answer_from_a_node_not_clean_since_it_started_is_unsure_copy_or_none() {
        let d = |present, current, clean| ObjDigest {
            present,
            current,
            clean_epoch: Epoch(clean),
            crc: 0,
            corrupt: false,
            version: Default::default(),
        };
        assert!(unsure_since_boot(&d(true, false, 0)));
        assert!(
            unsure_since_boot(&d(false, false, 0)),
            "none here, new disk"
        );
        assert!(!unsure_since_boot(&d(false, false, 9)));
        assert!(!unsure_since_boot(&d(true, false, 9)));
        assert!(!unsure_since_boot(&d(true, true, 0)));
    }
}
