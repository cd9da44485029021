//! Settling a VDI after its writer stopped (what a new writer does first, and `vdi
//! check --repair`) on the simulator: drove's own check and recovery code over a
//! simulated network and disks.
use bytes::Bytes;
use drove_sim::cluster::{Disks, SimCluster};
use drove_sim::Model;
use drove_types::{NodeId, ObjVersion, ObjectId, WritePolicy};
use std::time::Duration;

#[test]
fn test_settling_keeps_the_copy_with_the_latest_writes_when_none_is_known_current() {
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let model = Model {
            zones: 1,
            nodes_per_zone: 3,
            ..Model::default()
        };
        let c = SimCluster::new(model, 64 << 10, Disks::Memory);
        let vdi = c
            .create_vdi("v", 1 << 20, None, WritePolicy::Sync)
            .await
            .unwrap();
        c.publish();
        let g = c
            .acquire("v", NodeId(1), Duration::from_secs(60))
            .await
            .unwrap();
        let oid = ObjectId::new(vdi.id, 0);
        let gw = c.node(NodeId(1)).unwrap().gateway.clone();
        gw.write(&vdi, oid, 0, Bytes::from(vec![1u8; 4096]), false, g)
            .await
            .unwrap();
        // The copies diverge as after a cut: the placement's last node took a later
        // write (a later version) that the first two missed, and no copy is known
        // current. The first readable copy once won, whatever its version (found by
        // the simulator: `drove sim faults --seed 672 --time 40s`).
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        assert_eq!(placed.len(), 3);
        let newer = c.node(placed[2]).unwrap();
        let v = newer.store.version(oid).unwrap();
        let later = ObjVersion {
            epoch: v.epoch + 1,
            ..v
        };
        newer
            .store
            .write_versioned(oid, 0, &[2u8; 4096], later)
            .unwrap();
        for &n in &placed {
            c.node(n).unwrap().local.catchup().mark_pending(oid);
        }
        // What the daemon's Settler does: compare the copies, make them identical.
        c.node(NodeId(1))
            .unwrap()
            .recoverer
            .check(&vdi, true)
            .await
            .unwrap();
        for &n in &placed {
            let node = c.node(n).unwrap();
            let got = node.store.read(oid, 0, 4096).unwrap();
            assert!(
                got.iter().all(|&b| b == 2),
                "node {n} kept an older copy (its first byte is {})",
                got[0]
            );
            assert!(node.local.catchup().is_current(oid), "node {n}");
        }
    });
}
