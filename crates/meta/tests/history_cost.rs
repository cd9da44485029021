//! What the epoch history costs at the paper's scale (88 nodes in 4 zones) as
//! epochs go by, kept whole or trimmed whenever every node is up again: the state
//! machine's work per epoch (it copies the history when a reader holds the state
//! before), each node's watcher rebuilding its copy of the maps, and the state's
//! size (what a Raft snapshot carries). The figures are printed by
//!
//!     cargo test --release -p drove-meta --test history_cost -- --ignored --nocapture
//!
//! and kept in docs/simulator.md; the test itself checks only what does not depend
//! on the machine.
use drove_meta::{Command, MetaState};
use drove_types::{ClusterMap, NodeId, NodeInfo, NodeState};
use std::sync::Arc;
use std::time::Instant;

const NODES: u64 = 88;

fn cluster() -> MetaState {
    let mut s = MetaState::default();
    for id in 1..=NODES {
        while s.next_node_id <= id {
            s.apply(&Command::AllocateNodeId, 1).unwrap();
        }
        let info = NodeInfo {
            admin_addr: format!("10.0.{}.{}:7000", id / 200, id % 200),
            peer_addr: format!("10.0.{}.{}:7001", id / 200, id % 200),
            nbd_addr: format!("10.0.{}.{}:10809", id / 200, id % 200),
            nbd_socket: "/run/drove/nbd.sock".into(),
            ..NodeInfo::new(NodeId(id), format!("z{}", 1 + (id - 1) / 22))
        };
        s.apply(&Command::UpsertNode(info), 1).unwrap();
    }
    s
}

/// Run `flips` down-and-up cycles of one node each (two epochs a cycle), the
/// history trimmed after each return when `trim`; what it cost.
fn run(flips: u64, trim: bool) -> (MetaState, f64, f64) {
    let mut s = cluster();
    let mut held: Option<MetaState> = None;
    let mut maps: Arc<Vec<ClusterMap>> = Arc::default();
    let (mut apply_s, mut watch_s) = (0.0, 0.0);
    for i in 0..flips {
        let id = NodeId(1 + i % NODES);
        for state in [NodeState::Down, NodeState::Up] {
            let t = Instant::now();
            // A reader (the watcher, an API call) holds the state before: the
            // history is copied if the command changes it.
            held = Some(s.clone());
            let cmd = Command::JudgeNodes {
                verdicts: vec![(id, state)],
                term: 1,
            };
            s.apply(&cmd, 100 + i).unwrap();
            if trim && state == NodeState::Up {
                let keep_from = s.map.epoch;
                s.apply(&Command::TrimHistory { keep_from }, 100 + i)
                    .unwrap();
            }
            apply_s += t.elapsed().as_secs_f64();
            // Each node's watcher copies the maps at every epoch change.
            let t = Instant::now();
            maps = Arc::new(s.epoch_history.iter().map(|r| r.map.clone()).collect());
            watch_s += t.elapsed().as_secs_f64();
        }
    }
    drop(held);
    assert!(!maps.is_empty());
    (s, apply_s, watch_s)
}

#[test]
#[ignore]
fn test_print_what_the_history_costs_at_88_nodes() {
    for flips in [500u64, 2000] {
        for trim in [false, true] {
            let (s, apply_s, watch_s) = run(flips, trim);
            let epochs = flips * 2;
            let bytes = serde_json::to_vec(&s).unwrap().len();
            println!(
                "{epochs} epochs, {}: {} records kept ({} notes), state {:.1} MB as JSON; \
                 per epoch: apply {:.1} us, watcher's copy of the maps {:.1} us",
                if trim { "trimmed" } else { "kept whole" },
                s.epoch_history.len(),
                s.trimmed_notes.len(),
                bytes as f64 / 1e6,
                apply_s / epochs as f64 * 1e6,
                watch_s / epochs as f64 * 1e6,
            );
        }
    }
}

#[test]
fn test_a_history_trimmed_at_each_return_stays_one_record_long() {
    let (s, _, _) = run(200, true);
    assert_eq!(s.epoch_history.len(), 1);
    assert_eq!(s.epoch_history[0].epoch, s.map.epoch);
    let (whole, _, _) = run(200, false);
    assert_eq!(whole.epoch_history.len() as u64, whole.map.epoch.0);
}
