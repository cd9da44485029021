//! The invariants: whether a read is one the run may return, and the final check
//! of every block, copy and lock after everything healed.
use drove_replica::local::DigestBy;
use drove_types::{ObjectId, VdiInfo, WritePolicy};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::*;
use crate::cluster::SimCluster;
use crate::model::Model;

/// Why a read during the run of write `got` is wrong, if it is: not a write of the
/// block at all, or (sync) older than the last acknowledged one.
pub(super) fn judge_read(recs: &[Rec], got: u64, policy: WritePolicy) -> Option<String> {
    if got != 0 && !recs.iter().any(|r| r.seq == got) {
        return Some(format!("returned write {got}, never issued"));
    }
    if policy == WritePolicy::Sync {
        let last = recs
            .iter()
            .filter(|r| r.acked_at.is_some())
            .map(|r| r.seq)
            .max();
        if let Some(last) = last {
            if got < last {
                let r = recs.iter().find(|r| r.seq == last);
                let at = r
                    .and_then(|r| r.acked_at)
                    .map_or(0, |t| crate::sim_offset(t).as_millis());
                let how = if r.is_some_and(|r| r.durable) {
                    " durable"
                } else {
                    ""
                };
                let holders = r.map(|r| r.holders.clone()).unwrap_or_default();
                let now = crate::sim_offset(Instant::now()).as_millis();
                return Some(format!(
                    "returned write {got} at {now} ms after write {last} was acknowledged{how} at {at} ms on nodes {holders:?}"
                ));
            }
        }
    }
    None
}

/// Every node's copy of `oid` (for a failed seed's report): placed or not, known
/// current or not, its version and checksum.
pub(super) async fn copies_of(c: &Arc<SimCluster>, vdi: &VdiInfo, oid: ObjectId) -> String {
    let map = c.map();
    let placed = drove_placement::locate_vdi(&map, vdi, oid);
    let mut out = format!(
        "  object {oid} (placed on {placed:?} at epoch {}):",
        map.epoch
    );
    for id in c.node_ids() {
        let Some(n) = c.node(id) else { continue };
        let Ok(d) = n
            .local
            .digest(oid, vdi.object_size, DigestBy::Reading)
            .await
        else {
            continue;
        };
        if d.present || placed.contains(&id) {
            out.push_str(&format!(
                " [node {id}{}: {} v{}.{} crc {:08x}{}]",
                if placed.contains(&id) { " placed" } else { "" },
                if d.current { "current" } else { "pending" },
                d.version.generation,
                d.version.epoch,
                d.crc,
                if d.present { "" } else { " missing" },
            ));
        }
    }
    out
}

/// Read every block the client wrote and judge what it holds; (acked, failed,
/// reads) of the client.
pub(super) async fn final_check(
    c: &Arc<SimCluster>,
    cl: &Client,
    (hits, losses): (&[Hit], &[Loss]),
    violations: &mut Vec<String>,
) -> (u64, u64, u64) {
    let (blocks, acked, failed, reads, mut vs) = {
        let mut b = cl.book.lock();
        (
            b.blocks.clone(),
            b.acked,
            b.failed,
            b.reads,
            std::mem::take(&mut b.violations),
        )
    };
    violations.append(&mut vs);
    let Some(vdi) = c.vdi(&cl.name) else {
        violations.push(format!("VDI {} is gone", cl.name));
        return (acked, failed, reads);
    };
    let Some(node) = c.node(cl.node) else {
        return (acked, failed, reads);
    };
    match node.recoverer.check(&vdi, false).await {
        Ok(r) if r.mismatched.is_empty() && r.degraded == 0 => {}
        Ok(r) => {
            violations.push(format!(
                "VDI {}: {} of {} objects have differing replicas, {} fewer than {} copies",
                cl.name,
                r.mismatched.len(),
                r.objects,
                r.degraded,
                vdi.copies
            ));
            for m in r.mismatched.iter().take(3) {
                violations.push(copies_of(c, &vdi, m.oid).await);
            }
        }
        Err(e) => violations.push(format!("VDI {}: check failed: {e}", cl.name)),
    }
    let home = vdi.home_zone.clone();
    let max_lag = Duration::from_millis(u64::from(vdi.max_lag_ms.unwrap_or(5000)));
    // A zone-sync write may be lost when its home zone was hit while it could still
    // be unshipped: a fault under way at some time within the lag bound after it
    // was acknowledged.
    let exempt = |t: Instant| {
        cl.policy == WritePolicy::ZoneSync
            && hits.iter().any(|h| {
                Some(Model::zone_name(h.zone)) == home && h.at <= t + max_lag && h.until >= t
            })
    };
    let mut lost_shown = 0;
    for (block, recs) in blocks {
        let (oid, off) = place(&vdi, block);
        let data = match node.gateway.read(&vdi, oid, off, BLOCK as u32).await {
            Ok(d) => d,
            Err(e) => {
                violations.push(format!(
                    "VDI {} block {block}: final read failed: {e}",
                    cl.name
                ));
                continue;
            }
        };
        let got = match decode(vdi.id.0, block, &data) {
            Ok(g) => g,
            Err(why) => {
                violations.push(format!("VDI {} block {block}: holds {why}", cl.name));
                continue;
            }
        };
        if got != 0 && !recs.iter().any(|r| r.seq == got) {
            violations.push(format!(
                "VDI {} block {block}: holds write {got}, never issued",
                cl.name
            ));
        }
        // A write acknowledged durable must be there whatever the power did; one
        // that was not may be gone only when every copy that took it lost its
        // page cache since.
        let must = recs
            .iter()
            .filter(|r| r.acked_at.is_some_and(|t| !exempt(t)))
            .filter(|r| !lost_with_power(r, losses, cl.node))
            .max_by_key(|r| r.seq);
        if let Some(Rec {
            seq: must,
            acked_at,
            durable,
            holders,
        }) = must
        {
            let must = *must;
            if got < must {
                let at = acked_at.map_or(0, |t| crate::sim_offset(t).as_millis());
                let how = if *durable { " durable" } else { "" };
                violations.push(format!(
                    "VDI {} ({:?}) block {block}: holds write {got}, but write {must} was acknowledged{how} at {at} ms on nodes {holders:?}",
                    cl.name, cl.policy
                ));
                if lost_shown < 3 {
                    lost_shown += 1;
                    violations.push(copies_of(c, &vdi, oid).await);
                }
            }
        }
    }
    (acked, failed, reads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_block_decodes_to_its_write_and_other_bytes_do_not() {
        let d = block_data(3, 17, 42);
        assert_eq!(decode(3, 17, &d), Ok(42));
        assert_eq!(decode(3, 17, &[0u8; BLOCK]), Ok(0));
        assert!(decode(3, 18, &d).is_err(), "another block's write");
        assert!(decode(4, 17, &d).is_err(), "another VDI's write");
        let mut torn = d.to_vec();
        torn[3000] ^= 1;
        assert!(decode(3, 17, &torn).is_err(), "a flipped byte");
    }

    #[test]
    fn test_a_sync_read_older_than_an_acknowledged_write_is_wrong() {
        let t = Instant::now();
        let recs = [
            Rec {
                seq: 1,
                acked_at: Some(t),
                durable: false,
                holders: vec![],
            },
            Rec {
                seq: 2,
                acked_at: None,
                durable: false,
                holders: vec![],
            },
        ];
        assert_eq!(judge_read(&recs, 1, WritePolicy::Sync), None);
        assert_eq!(
            judge_read(&recs, 2, WritePolicy::Sync),
            None,
            "a write under way"
        );
        assert!(judge_read(&recs, 0, WritePolicy::Sync).is_some());
        assert_eq!(judge_read(&recs, 0, WritePolicy::ZoneSync), None);
        assert!(judge_read(&recs, 9, WritePolicy::ZoneSync).is_some());
    }
}
