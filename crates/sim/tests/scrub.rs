//! A scrub's repair of a rotten copy known current, on the simulator with drove's
//! own volume, replicas and recovery.
use bytes::Bytes;
use drove_sim::testing::{attached, first_write, small, OBJECT};
use drove_types::ObjectId;

/// A scrub finds a block of a copy known current rotten. The copy holds a write the
/// other copies do not have yet (it reached this copy first and is still on its way
/// to them: here written into this copy alone). The scrub's repair rewrites the
/// rotten block from another copy and keeps the rest: it once replaced the copy
/// whole with another one fetched before the write reached it, and the write was
/// gone from this copy, acknowledged once it reached the others.
#[test]
fn test_a_scrub_mends_a_rotten_current_copy_and_keeps_its_other_blocks() {
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let (c, vdi) = small(3).await;
        let os = OBJECT;
        let oid = ObjectId::new(vdi.id, 0);
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        let v = attached(&c, &vdi, placed[1]);
        first_write(&c, &v, 0, Bytes::from(vec![1u8; os as usize])).await;

        let rotten = c.node(placed[0]).unwrap();
        // The write on its way: block 2 of this copy has it, the others not yet.
        rotten.store.write(oid, 2 * 4096, &[7u8; 4096]).unwrap();
        // Block 5 rots.
        rotten.mem.as_ref().unwrap().corrupt_block(oid, 5);
        let report = rotten.recoverer.scrub().await.unwrap();
        assert_eq!(report.repaired, 1, "{report:?}");

        let got = rotten.store.read(oid, 0, os).unwrap();
        assert!(
            got[2 * 4096..3 * 4096].iter().all(|&b| b == 7),
            "the scrub's repair replaced the copy whole: the write it held is gone"
        );
        assert!(
            got[5 * 4096..6 * 4096].iter().all(|&b| b == 1),
            "the rotten block was rewritten from another copy"
        );
    });
}
