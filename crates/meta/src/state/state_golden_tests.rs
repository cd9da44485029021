//! `MetaState` is what a Raft snapshot stores (serde JSON): a sample written by
//! the last release (5def163; state_golden.json, printed by a program built against
//! its crates/meta) must read as the same state in this build, or a node upgraded
//! from it could not open its own snapshot.
use super::{MetaState, VdiLock};
use drove_types::{ClusterMap, Epoch, NodeId, NodeInfo, NodeState, VdiId, VdiInfo};
use std::sync::Arc;

const GOLDEN: &str = include_str!("state_golden.json");

/// The state the golden file was printed from, built the same way.
fn sample() -> MetaState {
    let mut s = MetaState::default();
    let mut map = ClusterMap {
        epoch: Epoch(7),
        ..ClusterMap::default()
    };
    for (i, z) in [(1u64, "z1"), (2, "z2")] {
        map.nodes.insert(
            NodeId(i),
            NodeInfo {
                admin_addr: format!("127.0.0.1:{}", 7000 + i),
                peer_addr: format!("127.0.0.1:{}", 8000 + i),
                nbd_addr: format!("127.0.0.1:{}", 9000 + i),
                // As the release before feature levels wrote it.
                features: 0,
                version: String::new(),
                ..NodeInfo::new(NodeId(i), z)
            },
        );
    }
    map.nodes.get_mut(&NodeId(2)).unwrap().state = NodeState::Down;
    s.map = map;
    let mut vdis = std::collections::BTreeMap::new();
    vdis.insert(
        "disk".to_string(),
        VdiInfo::new(VdiId(3), "disk", 1 << 30, 4 << 20, 2),
    );
    s.vdis = Arc::new(vdis);
    s.next_vdi_id = 4;
    s.next_node_id = 3;
    s.locks.insert(
        VdiId(3),
        VdiLock {
            owner: NodeId(1),
            generation: 5,
            expires_ms: 1_700_000_010_000,
            handover_to: None,
            vdi: VdiId(3),
            incarnation: 77,
            home_zone: Some("z1".into()),
            lease_ms: 10_000,
        },
    );
    s.lease_term = 2;
    s.lock_generations.insert(VdiId(3), 5);
    s.settled.insert(VdiId(3), 4);
    s.removed.insert(NodeId(9));
    s.held_down.insert(NodeId(2), 1_700_000_060_000);
    s
}

#[test]
fn test_the_last_releases_state_reads_as_the_same_state() {
    let read: MetaState = serde_json::from_str(GOLDEN.trim()).unwrap();
    assert_eq!(read, sample());
}
