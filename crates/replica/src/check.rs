//! `drove vdi check` and scrub: compare the replicas of objects and repair the ones
//! that differ or rot.
//!
//! - A check lists every object of a VDI on every up node and asks each replica for a
//!   digest (crc32c of the whole object, which also verifies every block checksum).
//!   Replicas agree when they all answer, none is corrupt or waiting for recovery,
//!   and the digests are equal. With repair, every other replica is replaced by the
//!   first good one in placement order. After a gateway crash any replica's copy is a
//!   valid outcome for writes that no FLUSH covered (flushed writes are on all of
//!   them), so picking one is enough; picking the same one for all is what matters.
//! - A scrub reads every object stored on this node; a copy that fails its block
//!   checksums is marked pending and recovered from a current replica.
use drove_placement::locate_vdi;
use drove_proto::ObjDigest;
use drove_types::{NodeId, ObjectId, Result, VdiInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

use crate::local::{blocking, DigestBy};
use crate::recovery::{pick_source, Recoverer};

/// One replica of one object as a check saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    /// The node.
    pub node: NodeId,
    /// Its digest; `None` when it did not answer.
    pub digest: Option<ObjDigest>,
}

/// An object whose replicas disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    /// The object.
    pub oid: ObjectId,
    /// Every replica.
    pub replicas: Vec<ReplicaView>,
    /// Whether a repair made them identical.
    pub repaired: bool,
}

/// The result of `vdi check`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Objects stored anywhere for the VDI.
    pub objects: u64,
    /// Objects whose replicas are identical.
    pub identical: u64,
    /// Objects whose replicas are not.
    pub mismatched: Vec<Mismatch>,
    /// Objects that have fewer replicas than the VDI's copies (nodes down).
    pub degraded: u64,
}

/// The result of a scrub on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubReport {
    /// Objects read.
    pub objects: u64,
    /// Copies that failed their checksums.
    pub corrupt: u64,
    /// Of those, copies that read whole after the scrub mended or replaced them.
    pub repaired: u64,
}

/// The sum of the scrubs a node ran since it started (for /metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrubTotals {
    /// Scrubs finished.
    pub runs: u64,
    /// Objects read.
    pub objects: u64,
    /// Copies that failed their checksums.
    pub corrupt: u64,
    /// Of those, copies that read whole after the scrub mended or replaced them.
    pub repaired: u64,
    /// When the last scrub finished, seconds since the Unix epoch (0: none yet).
    pub last_unix: u64,
}

impl ScrubTotals {
    /// Count one finished scrub.
    pub fn add(&mut self, r: &ScrubReport, at: std::time::SystemTime) {
        self.runs += 1;
        self.objects += r.objects;
        self.corrupt += r.corrupt;
        self.repaired += r.repaired;
        self.last_unix = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
    }
}

fn agree(ds: &[ReplicaView]) -> bool {
    let mut crcs = BTreeSet::new();
    for r in ds {
        match r.digest {
            Some(d) if d.current && !d.corrupt => {
                crcs.insert(d.crc);
            }
            _ => return false,
        }
    }
    crcs.len() <= 1
}

impl Recoverer {
    /// Compare the replicas of every object of `vdi`; with `repair`, make the ones
    /// that differ identical. The caller makes sure nothing writes the VDI meanwhile.
    pub async fn check(&self, vdi: &VdiInfo, repair: bool) -> Result<CheckReport> {
        let view = self.view();
        // A node that does not answer the listing (cut off, not yet marked down) is
        // reported as not answering rather than asked again for every object.
        let (listed, silent) = self.list_answering(&view.map).await;
        let mut oids: Vec<ObjectId> = listed.keys().filter(|o| o.vdi == vdi.id).copied().collect();
        oids.sort();
        let mut report = CheckReport {
            objects: oids.len() as u64,
            ..Default::default()
        };
        let epoch = view.map.epoch;
        for oid in oids {
            let placed = locate_vdi(&view.map, vdi, oid);
            if placed.len() < usize::from(vdi.copies) {
                report.degraded += 1;
            }
            let replicas = self
                .views(&placed, &silent, oid, vdi.object_size, epoch)
                .await;
            if agree(&replicas) {
                report.identical += 1;
                continue;
            }
            let mut m = Mismatch {
                oid,
                replicas,
                repaired: false,
            };
            if repair {
                m.repaired = self.make_identical(&m, vdi, epoch).await;
            }
            report.mismatched.push(m);
        }
        Ok(report)
    }

    async fn views(
        &self,
        nodes: &[NodeId],
        silent: &[NodeId],
        oid: ObjectId,
        len: u32,
        epoch: drove_types::Epoch,
    ) -> Vec<ReplicaView> {
        let ask: Vec<NodeId> = nodes
            .iter()
            .copied()
            .filter(|n| !silent.contains(n))
            .collect();
        let got = self
            .digests_of(&ask, oid, len, epoch, DigestBy::Reading)
            .await;
        nodes
            .iter()
            .map(|&n| ReplicaView {
                node: n,
                digest: got.iter().find(|(x, _)| *x == n).map(|(_, d)| *d),
            })
            .collect()
    }

    /// Make the replicas of `m` identical: the copy to keep is chosen as recovery
    /// chooses its source ([`pick_source`]). The first readable copy, whatever its
    /// version, once won when none was current: after a gateway crash, an older
    /// copy replaced the one holding the last acknowledged writes (`drove sim
    /// faults --seed 672 --time 40s`).
    ///
    /// A copy that fails its checksums first mends its rotten blocks from the
    /// others and the copies are compared again. Left out as unreadable instead, the
    /// home copies of a zone-sync VDI, each with a block flipped, took the far
    /// copy's, short of the writes not yet shipped (`drove sim faults --seed 9420
    /// --time 40s`).
    async fn make_identical(&self, m: &Mismatch, vdi: &VdiInfo, epoch: drove_types::Epoch) -> bool {
        let rotten: Vec<NodeId> = m
            .replicas
            .iter()
            .filter(|r| r.digest.is_some_and(|d| d.corrupt))
            .map(|r| r.node)
            .collect();
        let fresh;
        let replicas: &[ReplicaView] = if rotten.is_empty() {
            &m.replicas
        } else {
            for &n in &rotten {
                self.ask_repair(n, m.oid, vdi.object_size, n, epoch).await;
            }
            let nodes: Vec<NodeId> = m.replicas.iter().map(|r| r.node).collect();
            let silent: Vec<NodeId> = m
                .replicas
                .iter()
                .filter(|r| r.digest.is_none())
                .map(|r| r.node)
                .collect();
            fresh = self
                .views(&nodes, &silent, m.oid, vdi.object_size, epoch)
                .await;
            if agree(&fresh) {
                return true;
            }
            &fresh
        };
        let good = |r: &&ReplicaView| r.digest.is_some_and(|d| !d.corrupt);
        let readable: Vec<(NodeId, ObjDigest)> = replicas
            .iter()
            .filter_map(|r| r.digest.filter(|d| !d.corrupt).map(|d| (r.node, d)))
            .collect();
        let Some((&(first, mine), rest)) = readable.split_first() else {
            return false;
        };
        let view = self.view();
        let near = |n: NodeId, at: drove_types::Epoch| view.in_home(vdi, n, at);
        let src = if mine.current {
            Some((first, mine))
        } else {
            let stayed = |n: NodeId, at: drove_types::Epoch| view.placed_throughout(m.oid, n, at);
            pick_source(first, mine, rest, &near, &stayed).map(|(n, d, _)| (n, d))
        };
        let Some(src) = src.map(|(node, d)| ReplicaView {
            node,
            digest: Some(d),
        }) else {
            return false;
        };
        tracing::debug!(oid = %m.oid, src = %src.node, ?replicas, "check: making the copies identical");
        let src_crc = src.digest.map(|d| d.crc);
        let src_current = src.digest.is_some_and(|d| d.current);
        // A copy not known current is recovered first (it may be replaced by a
        // better one that recovery finds, or wait for nodes that took writes): only
        // then do the others take it.
        if !src_current
            && !self
                .ask_repair(src.node, m.oid, vdi.object_size, src.node, epoch)
                .await
        {
            return false;
        }
        let mut ok = true;
        for r in replicas {
            if r.node == src.node && !src_current {
                continue;
            }
            if r.digest.is_none() {
                // Unreachable: it cannot be repaired now. The caller marks it down, so
                // it recovers every copy before serving again.
                continue;
            }
            if r.node == src.node || (r.digest.map(|d| d.crc) == src_crc && good(&r)) {
                if r.digest.is_some_and(|d| !d.current) {
                    ok &= self
                        .ask_repair(r.node, m.oid, vdi.object_size, r.node, epoch)
                        .await;
                }
                continue;
            }
            ok &= self
                .ask_repair(r.node, m.oid, vdi.object_size, src.node, epoch)
                .await;
        }
        ok
    }

    /// Scrub this node: read every object it stores; recover copies that are corrupt.
    pub async fn scrub(&self) -> Result<ScrubReport> {
        self.scrub_at(false).await
    }

    /// Like [`Recoverer::scrub`], reading no faster than the recovery rate limit (the
    /// background scrub must not take the disk from the VMs).
    pub async fn scrub_paced(&self) -> Result<ScrubReport> {
        self.scrub_at(true).await
    }

    /// What every scrub of this node found since the process started.
    pub fn scrub_totals(&self) -> ScrubTotals {
        *self.scrubbed.lock()
    }

    async fn scrub_at(&self, paced: bool) -> Result<ScrubReport> {
        let view = self.view();
        let local = blocking(self.local.store(), |s| s.list()).await?;
        let mut report = ScrubReport::default();
        for oid in local {
            let Some(vdi) = view.vdis.get(&oid.vdi) else {
                continue;
            };
            report.objects += 1;
            if paced {
                self.throttle(u64::from(vdi.object_size)).await;
            }
            let d = self
                .local
                .digest(oid, vdi.object_size, DigestBy::Reading)
                .await?;
            if !d.corrupt {
                continue;
            }
            report.corrupt += 1;
            tracing::warn!(%oid, "scrub: the copy fails its checksums, recovering it");
            // Counted repaired only once the copy reads whole: a copy no other copy
            // can mend or replace (none holds the blocks whole) is left as it was.
            let len = vdi.object_size;
            let res = match self.recover_rotten(oid, len).await {
                Ok(()) => self.local.digest(oid, len, DigestBy::Reading).await,
                Err(e) => Err(e),
            };
            match res {
                Ok(d) if !d.corrupt => report.repaired += 1,
                Ok(_) => {
                    tracing::warn!(%oid, "scrub: cannot repair: no copy holds its rotten blocks whole")
                }
                Err(e) => tracing::warn!(%oid, "scrub: cannot repair: {e}"),
            }
        }
        self.scrubbed
            .lock()
            .add(&report, std::time::SystemTime::now());
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_scrub_totals_add_up_every_run() {
        let mut t = ScrubTotals::default();
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        t.add(
            &ScrubReport {
                objects: 10,
                corrupt: 2,
                repaired: 1,
            },
            at,
        );
        t.add(
            &ScrubReport {
                objects: 5,
                corrupt: 0,
                repaired: 0,
            },
            at + std::time::Duration::from_secs(60),
        );
        assert_eq!(
            t,
            ScrubTotals {
                runs: 2,
                objects: 15,
                corrupt: 2,
                repaired: 1,
                last_unix: 1_800_000_060,
            }
        );
    }
}
