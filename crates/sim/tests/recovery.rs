//! Recovery on the simulator: drove's own recovery code over a simulated network
//! and disks, for cases a fault run reaches only by chance.
use bytes::Bytes;
use drove_sim::cluster::{Disks, SimCluster};
use drove_sim::Model;
use drove_types::{NodeId, NodeState, ObjectId, WritePolicy};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// Run the failure detector until `node` is in `state` (at most a simulated
/// minute).
async fn until_state(c: &SimCluster, node: NodeId, state: NodeState) {
    let mut since = BTreeMap::new();
    let limit = Instant::now() + Duration::from_secs(60);
    while Instant::now() < limit {
        c.detect(&mut since).await;
        if c.map().node(node).is_some_and(|n| n.state == state) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("node {node} never became {state:?}");
}

/// Copies are compared by their block checksums, which do not see data that rotted
/// under them: the source so chosen fails when it sends its copy, and recovery must
/// then compare the copies by reading them and take the good one. Without that
/// second look it chose the same rotten source round after round and the returning
/// node never caught up.
#[test]
fn test_a_returning_node_passes_over_a_source_whose_data_rotted() {
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
        let oid = ObjectId::new(vdi.id, 0);
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        assert_eq!(placed.len(), 3);
        // The writer is one node, the returning node another.
        let writer = placed[0];
        let back = placed[2];
        let g = c
            .acquire("v", writer, Duration::from_secs(600))
            .await
            .unwrap();
        let gw = c.node(writer).unwrap().gateway.clone();
        gw.write(&vdi, oid, 0, Bytes::from(vec![1u8; 8192]), false, g)
            .await
            .unwrap();
        c.crash(back);
        until_state(&c, back, NodeState::Down).await;
        // Written while it is away: its copy is now behind (an older version).
        gw.write(&vdi, oid, 0, Bytes::from(vec![2u8; 8192]), false, g)
            .await
            .unwrap();
        // The data of the first source recovery tries rots under its checksums.
        let rotten = c.node(placed[0]).unwrap();
        rotten.mem.as_ref().unwrap().corrupt_block(oid, 1);
        assert!(rotten.store.read(oid, 0, 8192).is_err());
        c.restart(back).await;
        until_state(&c, back, NodeState::Up).await;
        let node = c.node(back).unwrap();
        let limit = Instant::now() + Duration::from_secs(60);
        loop {
            let p = node.recoverer.progress();
            if p.clean && p.epoch == c.map().epoch.0 {
                break;
            }
            assert!(Instant::now() < limit, "node {back} never caught up: {p:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let got = node.store.read(oid, 0, 8192).unwrap();
        assert!(
            got.iter().all(|&b| b == 2),
            "node {back} holds an older copy (first byte {})",
            got[0]
        );
        assert!(node.local.catchup().is_current(oid));
    });
}

/// A node with no copy of an object says whether there is anything to have only
/// on the map of the request it answers. Here every holder is marked down, so the
/// object falls to a node that never had it; they come back, and on the new map
/// that node holds nothing and knows it. A read made on the earlier map, admitted
/// before the node worked the new one out, was answered on the new map: zeros,
/// for data acknowledged long before (`drove sim faults --seed 121 --time 40s`).
#[test]
fn test_an_absent_copy_is_answered_for_on_the_map_of_the_request_only() {
    use drove_meta::Command;
    use drove_proto::{PeerReq, PeerResp};
    use drove_types::ErrorKind;
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let model = Model {
            zones: 1,
            nodes_per_zone: 4,
            ..Model::default()
        };
        let c = SimCluster::new(model, 64 << 10, Disks::Memory);
        let vdi = c
            .create_vdi("v", 1 << 20, None, WritePolicy::Sync)
            .await
            .unwrap();
        c.publish();
        let oid = ObjectId::new(vdi.id, 0);
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        let x = (1..=4).map(NodeId).find(|n| !placed.contains(n)).unwrap();
        let g = c
            .acquire("v", placed[0], Duration::from_secs(600))
            .await
            .unwrap();
        let gw = c.node(placed[0]).unwrap().gateway.clone();
        gw.write(&vdi, oid, 0, Bytes::from(vec![5u8; 4096]), false, g)
            .await
            .unwrap();
        let judge = |state| Command::JudgeNodes {
            verdicts: placed.iter().map(|&n| (n, state)).collect(),
            term: 0,
        };
        c.apply(&judge(NodeState::Down)).unwrap();
        let down = c.map().epoch;
        assert_eq!(
            drove_placement::locate_vdi(&c.map(), &vdi, oid),
            vec![x],
            "the object falls to the node without a copy"
        );
        let node = c.node(x).unwrap();
        let limit = Instant::now() + Duration::from_secs(30);
        while node.local.catchup().epoch() != down {
            assert!(
                Instant::now() < limit,
                "node {x} never worked out epoch {down}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let read = PeerReq::Read {
            oid,
            offset: 0,
            len: 4096,
            epoch: down,
        };
        // Nobody up listed a copy: it is not pending there (asked on that map, it
        // would find its holders down and wait for them). They come back: on the new map it holds nothing, and knows it; the
        // earlier map's read, admitted at the epoch it has worked out, is sent
        // to the newer map, not answered with zeros.
        c.apply(&judge(NodeState::Up)).unwrap();
        assert!(node.local.catchup().is_current(oid));
        assert_eq!(node.local.catchup().epoch(), down, "not worked out yet");
        match node.local.apply(&read, Bytes::new()).await {
            Err(e) => assert_eq!(e.kind(), ErrorKind::StaleEpoch, "{e}"),
            Ok((PeerResp::Data, data)) => panic!(
                "a read of epoch {down} answered on the newer map: {} bytes, first {}",
                data.len(),
                data[0]
            ),
            Ok(other) => panic!("{other:?}"),
        }
    });
}

/// A zone-sync VDI's far copy lags its home copies at the same version. When each
/// home copy has a block flipped, the far copy is the only one that reads whole,
/// and it is short of the last writes: recovery made it current and then the home
/// copies took it, losing those writes (`drove sim faults --seed 9420 --time
/// 40s`). The home copies must mend their rotten blocks from each other, and the
/// far copy wait for them.
#[test]
fn test_flipped_home_copies_are_mended_from_each_other_not_replaced_by_the_far_copy() {
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let model = Model {
            zones: 2,
            nodes_per_zone: 3,
            ..Model::default()
        };
        let c = SimCluster::new(model, 64 << 10, Disks::Memory);
        let vdi = c
            .create_vdi("v", 1 << 20, Some(0), WritePolicy::ZoneSync)
            .await
            .unwrap();
        c.publish();
        let oid = ObjectId::new(vdi.id, 0);
        let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
        let in_home = |n: &NodeId| c.map().node(*n).unwrap().zone == Model::zone_name(0);
        let home: Vec<NodeId> = placed.iter().copied().filter(in_home).collect();
        let far: Vec<NodeId> = placed.iter().copied().filter(|n| !in_home(n)).collect();
        assert_eq!((home.len(), far.len()), (2, 1), "placed on {placed:?}");
        let far = far[0];
        let g = c
            .acquire("v", home[0], Duration::from_secs(600))
            .await
            .unwrap();
        let gw = c.node(home[0]).unwrap().gateway.clone();
        let len = 4 * 4096;
        let holds = |n: NodeId, b: u8| {
            c.node(n)
                .unwrap()
                .store
                .read(oid, 0, len)
                .is_ok_and(|d| d.iter().all(|&x| x == b))
        };
        gw.write(&vdi, oid, 0, Bytes::from(vec![1u8; len as usize]), false, g)
            .await
            .unwrap();
        let limit = Instant::now() + Duration::from_secs(60);
        while !holds(far, 1) {
            assert!(
                Instant::now() < limit,
                "the far copy never got the first write"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The far zone is cut off: the next write is acknowledged by the home zone
        // alone, and the far copy keeps the first, at the same version.
        c.net.set_cut(1, true);
        gw.write(&vdi, oid, 0, Bytes::from(vec![2u8; len as usize]), false, g)
            .await
            .unwrap();
        assert!(holds(far, 1) && holds(home[0], 2) && holds(home[1], 2));
        // A block of each home copy rots under its checksums, not the same one.
        c.node(home[0])
            .unwrap()
            .mem
            .as_ref()
            .unwrap()
            .corrupt_block(oid, 1);
        c.node(home[1])
            .unwrap()
            .mem
            .as_ref()
            .unwrap()
            .corrupt_block(oid, 2);
        // Every node of the far zone is marked down: the lane has nowhere to ship
        // the write and drops it (the far copies recover when they come back).
        let far_zone: Vec<NodeId> = c.node_ids().into_iter().filter(|n| !in_home(n)).collect();
        for &n in &far_zone {
            until_state(&c, n, NodeState::Down).await;
        }
        c.net.set_cut(1, false);
        for &n in &far_zone {
            until_state(&c, n, NodeState::Up).await;
        }
        let node = c.node(far).unwrap();
        let limit = Instant::now() + Duration::from_secs(60);
        loop {
            let p = node.recoverer.progress();
            if p.clean && p.epoch == c.map().epoch.0 {
                break;
            }
            assert!(Instant::now() < limit, "node {far} never caught up: {p:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // What a settle does (the daemon's Settler): compare the copies and make
        // them identical.
        let vdi = c.vdi("v").unwrap();
        c.node(home[0])
            .unwrap()
            .recoverer
            .check(&vdi, true)
            .await
            .unwrap();
        for &n in &placed {
            let got = c.node(n).unwrap().store.read(oid, 0, len);
            assert!(
                got.as_ref().is_ok_and(|d| d.iter().all(|&x| x == 2)),
                "node {n} (far: {}) lost the acknowledged write: {:?}",
                n == far,
                got.map(|d| (0..4).map(|b| d[b * 4096]).collect::<Vec<u8>>())
            );
        }
        // No copy is left failing its checksums.
        for &n in &placed {
            let r = c.node(n).unwrap().recoverer.scrub().await.unwrap();
            assert_eq!(r.corrupt, 0, "node {n}: {r:?}");
        }
    });
}

/// A scrub that finds a rotten copy recovers it by reading the copies. When a
/// recovery that compares by checksums (which do not see the rot) has the object
/// first, it marks the copy current as it is; the scrub's recovery then found the
/// copy current and returned, and the scrub counted a copy repaired that still
/// failed its checksums (`drove sim faults --seed 1628 --time 40s`: node 3 was
/// catching up when it scrubbed).
#[test]
fn test_a_scrub_repairs_a_rotten_copy_that_a_recovery_by_checksums_passed() {
    use drove_replica::catchup::Repair;
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let (c, _, oid, placed) = one_object_written(3, false).await;
        let node = c.node(placed[1]).unwrap();
        node.mem.as_ref().unwrap().corrupt_block(oid, 2);
        // The copy is pending (as on a node catching up), and a recovery of it
        // starts first: compared by checksums, it looks like the others. It takes
        // a while, waiting for a node that crashed and is not marked down yet, so
        // the scrub finds the copy rotten meanwhile and waits for the object.
        c.crash(placed[2]);
        node.local.catchup().mark_pending(oid);
        let r = node.recoverer.clone();
        let first = tokio::spawn(async move { r.repair(oid).await });
        tokio::task::yield_now().await;
        let report = node.recoverer.scrub().await.unwrap();
        first.await.unwrap().unwrap();
        assert_eq!((report.corrupt, report.repaired), (1, 1), "{report:?}");
        let got = node.store.read(oid, 0, 16384);
        assert!(
            got.as_ref().is_ok_and(|d| d.iter().all(|&b| b == 3)),
            "the copy counted repaired is not: {:?}",
            got.map(|d| d[2 * 4096])
        );
        let again = node.recoverer.scrub().await.unwrap();
        assert_eq!(again.corrupt, 0, "{again:?}");
    });
}

/// A read while every copy of its object is being recovered (after a whole site's
/// power loss every copy is, until the nodes have compared them) waits for a copy
/// to be current instead of failing at once: a VM attached in that moment read EIO
/// 6 ms after its node came up (e2e_power_loss seed 525460, cut 17939:1).
#[test]
fn test_a_read_while_every_copy_is_being_recovered_waits_for_one() {
    let rt = drove_sim::runtime().unwrap();
    rt.block_on(async {
        let (c, vdi, oid, placed) = one_object_written(7, true).await;
        let gw = c.node(placed[0]).unwrap().gateway.clone();
        for n in &placed {
            c.node(*n).unwrap().local.catchup().mark_pending(oid);
        }
        let (gw2, vdi2) = (gw.clone(), vdi.clone());
        let read = tokio::spawn(async move { gw2.read(&vdi2, oid, 0, 4096).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!read.is_finished(), "the read did not wait for a copy");
        c.node(placed[1]).unwrap().local.catchup().mark_current(oid);
        let got = read.await.unwrap().expect("read once a copy is current");
        assert!(got.iter().all(|&b| b == 7));
    });
}

/// Three nodes in one zone, VDI "v" (1 MiB, 64 KiB objects, 3 copies), and the first
/// 16 KiB of its first object written with `byte` by the writer on the object's
/// first node (`fua`: acknowledged durable): the cluster, the VDI, the object and
/// the nodes it is placed on. Runs on the simulator's runtime.
async fn one_object_written(
    byte: u8,
    fua: bool,
) -> (
    std::sync::Arc<SimCluster>,
    drove_types::VdiInfo,
    ObjectId,
    Vec<NodeId>,
) {
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
    let oid = ObjectId::new(vdi.id, 0);
    let placed = drove_placement::locate_vdi(&c.map(), &vdi, oid);
    let g = c
        .acquire("v", placed[0], Duration::from_secs(600))
        .await
        .unwrap();
    let gw = c.node(placed[0]).unwrap().gateway.clone();
    gw.write(&vdi, oid, 0, Bytes::from(vec![byte; 16384]), fua, g)
        .await
        .unwrap();
    (c, vdi, oid, placed)
}
