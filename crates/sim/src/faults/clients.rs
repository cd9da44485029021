//! The simulated VMs: each writes and reads 4 KiB blocks of its VDI through its
//! node's `Volume`, every block carrying its VDI, index and sequence number, and
//! books what was acknowledged.
use bytes::Bytes;
use drove_types::{NodeId, ObjectId, VdiInfo};
use drove_volume::Volume;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::*;
use crate::cluster::SimCluster;
use crate::rng::Rng;

/// The 4 KiB a write of `seq` to `block` of VDI `vdi` carries.
pub(super) fn block_data(vdi: u32, block: u64, seq: u64) -> Bytes {
    let mut b = vec![(seq as u8) ^ (block as u8); BLOCK];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&vdi.to_le_bytes());
    b[12..20].copy_from_slice(&block.to_le_bytes());
    b[20..28].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(b)
}

/// The write a block's bytes are (0: never written), or why they are no write.
pub(super) fn decode(vdi: u32, block: u64, data: &[u8]) -> Result<u64, String> {
    if data.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let word = |r: std::ops::Range<usize>| {
        let mut w = [0u8; 8];
        w[..r.len()].copy_from_slice(&data[r]);
        u64::from_le_bytes(w)
    };
    let seq = word(20..28);
    if data.len() != BLOCK
        || word(0..8) != MAGIC
        || word(8..12) != u64::from(vdi)
        || word(12..20) != block
    {
        return Err("bytes that no write of this block carried".into());
    }
    if block_data(vdi, block, seq).as_ref() != data {
        return Err(format!("write {seq}'s header over other bytes"));
    }
    Ok(seq)
}

/// Where block `block` lies in its VDI: blocks spread over the VDI, four blocks
/// apart.
pub(super) fn block_offset(block: u64) -> u64 {
    block * 4 * BLOCK as u64
}

/// Where block `block` of `vdi` lies: its object and the offset in it.
pub(super) fn place(vdi: &VdiInfo, block: u64) -> (ObjectId, u64) {
    let off = block_offset(block);
    let os = u64::from(vdi.object_size);
    (ObjectId::new(vdi.id, (off / os) as u32), off % os)
}

/// A VM: writes (and some reads) through drove's own [`Volume`] on its node, which
/// takes, renews and gives up the VDI's lock with the daemon's lock service (and
/// settles an earlier writer's replicas first), while its node runs.
pub(super) async fn client(c: Arc<SimCluster>, cl: Arc<Client>, mut rng: Rng, end: Instant) {
    // The volume of the node's current run.
    let mut vol: Option<(u64, Arc<Volume>)> = None;
    let mut seq = 0u64;
    // Writes acknowledged since the last flush: (block, index of its record, object).
    let mut unflushed: Vec<(u64, usize, ObjectId)> = Vec::new();
    while Instant::now() < end {
        let Some(node) = c
            .node(cl.node)
            .filter(|n| n.transport.alive() && n.serving())
        else {
            // Its host is down (or its node not ready to serve): so is the VM.
            vol = None;
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let Some(vdi) = c.vdi(&cl.name) else {
            return;
        };
        let run = node.transport.incarnation();
        let v = match &vol {
            Some((r, v)) if *r == run => v.clone(),
            _ => {
                // The VM (re)attaches to its node's new run. Its host restarted:
                // so did the VM, and what it had not flushed it never asked to keep.
                unflushed.clear();
                let v = Volume::new(
                    vdi.clone(),
                    Vec::new(),
                    node.gateway.clone(),
                    node.locks.clone(),
                );
                v.attach();
                vol = Some((run, v.clone()));
                v
            }
        };
        if v.info() != vdi {
            v.set_info(vdi.clone(), Vec::new());
        }
        // A VM thinks between its I/Os.
        tokio::time::sleep(Duration::from_millis(1 + rng.below(10))).await;
        let block = rng.below(BLOCKS);
        let offset = block_offset(block);
        let (oid, _) = place(&vdi, block);
        let roll = rng.below(100);
        if roll < 5 && !unflushed.is_empty() {
            // A FLUSH: every write acknowledged before it is durable once it is.
            if let Ok(Ok(())) = tokio::time::timeout(OP_TIMEOUT, v.flush()).await {
                let mut b = cl.book.lock();
                for (block, i, _) in unflushed.drain(..) {
                    if let Some(r) = b.blocks.get_mut(&block).and_then(|v| v.get_mut(i)) {
                        r.durable = true;
                    }
                }
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else if roll < 80 {
            seq += 1;
            let fua = rng.chance(0.2);
            let data = block_data(vdi.id.0, block, seq);
            let i = {
                let mut b = cl.book.lock();
                let recs = b.blocks.entry(block).or_default();
                recs.push(Rec {
                    seq,
                    acked_at: None,
                    durable: false,
                    holders: Vec::new(),
                });
                recs.len() - 1
            };
            let res = tokio::time::timeout(OP_TIMEOUT, v.write_fenced(offset, data, fua)).await;
            let acked = match res {
                Ok(Ok(g)) => Some(g),
                _ => None,
            };
            let holders = if acked.is_some() {
                holders(&c, &vdi, oid)
            } else {
                Vec::new()
            };
            record_write(&c, &cl, (block, i), acked, fua, holders, vdi.id);
            if acked.is_some() && !fua {
                unflushed.push((block, i, oid));
            }
            if acked.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else {
            let res = tokio::time::timeout(OP_TIMEOUT, v.read(offset, BLOCK as u32)).await;
            if !matches!(res, Ok(Ok(_))) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if let Ok(Ok(data)) = res {
                let losses = cl.losses.lock().clone();
                let mut b = cl.book.lock();
                b.reads += 1;
                let mut recs = b.blocks.get(&block).cloned().unwrap_or_default();
                // A write that every copy lost with its page cache is no longer
                // one a read must return.
                for r in recs.iter_mut() {
                    if r.acked_at.is_some() && lost_with_power(r, &losses, cl.node) {
                        r.acked_at = None;
                    }
                }
                match decode(vdi.id.0, block, &data) {
                    Err(why) => b.violations.push(format!(
                        "VDI {} block {block}: a read returned {why}",
                        cl.name
                    )),
                    Ok(got) => {
                        if let Some(why) = judge_read(&recs, got, cl.policy) {
                            b.violations
                                .push(format!("VDI {} block {block}: a read {why}", cl.name));
                        }
                    }
                }
            }
        }
    }
}

/// The nodes the metadata's map places `oid` on and has up: the copies a write
/// acknowledged now was made on.
pub(super) fn holders(c: &SimCluster, vdi: &VdiInfo, oid: ObjectId) -> Vec<NodeId> {
    c.with_state(|st| {
        drove_placement::locate_vdi(&st.map, vdi, oid)
            .into_iter()
            .filter(|id| {
                st.map
                    .node(*id)
                    .is_some_and(|n| n.state == drove_types::NodeState::Up)
            })
            .collect()
    })
}

/// Book a write's outcome: `(block, index of its record, generation)`; an
/// acknowledged one is also checked against the lock the metadata holds.
#[allow(clippy::too_many_arguments)]
pub(super) fn record_write(
    c: &SimCluster,
    cl: &Client,
    at: (u64, usize),
    acked: Option<u64>,
    fua: bool,
    holders: Vec<NodeId>,
    vdi: drove_types::VdiId,
) {
    let (block, i) = at;
    let mut b = cl.book.lock();
    let Some(g) = acked else {
        b.failed += 1;
        return;
    };
    b.acked += 1;
    if let Some(r) = b.blocks.get_mut(&block).and_then(|v| v.get_mut(i)) {
        r.acked_at = Some(Instant::now());
        r.durable = fua;
        r.holders = holders;
    }
    let holder = c.with_state(|st| st.locks.get(&vdi).map(|l| (l.owner, l.generation)));
    if holder != Some((cl.node, g)) {
        b.violations.push(format!(
            "VDI {}: a write under generation {g} of node {} was acknowledged while the lock is {holder:?}",
            cl.name, cl.node
        ));
    }
}
