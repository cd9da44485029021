//! Unit tests of home-zone moves: a hand-over to another zone and a promotion.
use super::lock_tests::{acquire, lock_of as lock};
use super::*;
use drove_types::MAX_PAST_HOMES;

/// Nodes 1, 2, 3 in zones z1, z2, z3 and node 4 in z1; VDI `vm` (copies 3, `policy`),
/// without a home zone until the first lock.
fn state(policy: WritePolicy) -> MetaState {
    let mut s = super::lock_tests::state_with("vm");
    let n4 = NodeInfo {
        admin_addr: "127.0.0.1:7004".into(),
        peer_addr: "127.0.0.1:7104".into(),
        nbd_addr: "127.0.0.1:7204".into(),
        ..NodeInfo::new(NodeId(4), "z1".to_string())
    };
    super::tests::add(&mut s, n4, 100);
    if policy != WritePolicy::Sync {
        let set = Command::SetVdiPolicy {
            name: "vm".into(),
            policy: Some(policy),
            max_lag_ms: None,
            max_lag_bytes: None,
            reset_max_lag_ms: false,
            reset_max_lag_bytes: false,
        };
        s.apply(&set, 100).unwrap();
    }
    s
}

fn handover(s: &mut MetaState, to: u64) -> ApplyResult {
    s.apply(
        &Command::RequestHandover {
            vdi: "vm".into(),
            to: NodeId(to),
        },
        1_000,
    )
}

fn release(s: &mut MetaState, node: u64, generation: u64) {
    let cmd = Command::ReleaseLock {
        vdi: "vm".into(),
        node: NodeId(node),
        generation,
    };
    s.apply(&cmd, 1_000).unwrap();
}

fn down(s: &mut MetaState, id: u64) {
    let cmd = Command::SetNodeState {
        id: NodeId(id),
        state: NodeState::Down,
        reason: "test".into(),
        hold_ms: 0,
        judged: None,
    };
    s.apply(&cmd, 1_000).unwrap();
}

fn promote(s: &mut MetaState, zone: &str) -> ApplyResult {
    let cmd = Command::PromoteVdi {
        name: "vm".into(),
        zone: zone.into(),
    };
    s.apply(&cmd, 1_000)
}

fn home(s: &MetaState) -> Option<&str> {
    s.vdis["vm"].home_zone.as_deref()
}

#[test]
fn test_the_home_follows_a_handover_to_another_zone_at_a_new_epoch_on_release() {
    let mut s = state(WritePolicy::ZoneSync);
    let l = lock(acquire(&mut s, 1, 1_000_000));
    assert_eq!((home(&s), l.home_zone.as_deref()), (Some("z1"), Some("z1")));
    let before = s.map.epoch;
    handover(&mut s, 3).unwrap();
    assert_eq!(home(&s), Some("z1"), "not before the holder released");
    assert_eq!(s.map.epoch, before);
    release(&mut s, 1, l.generation);
    assert_eq!(home(&s), Some("z3"));
    assert_eq!(s.map.epoch, Epoch(before.0 + 1), "a move is a new epoch");
    let rec = s.epoch_history.last().unwrap();
    assert!(rec.change.contains("home zone z1 -> z3"), "{}", rec.change);
    assert_eq!(rec.map.nodes, s.map.nodes, "the map itself is unchanged");
    let v = &s.vdis["vm"];
    assert_eq!(
        v.home_at(before),
        Some("z1"),
        "earlier maps keep the old home"
    );
    assert_eq!(v.home_at(s.map.epoch), Some("z3"));
    // The new holder's grant carries the new home.
    let l3 = lock(acquire(&mut s, 3, 1_001_000));
    assert_eq!(
        (l3.generation, l3.home_zone.as_deref()),
        (l.generation + 1, Some("z3"))
    );
}

#[test]
fn test_a_handover_inside_the_zone_or_to_an_idle_vdi_moves_only_what_it_must() {
    let mut s = state(WritePolicy::Sync);
    let l = lock(acquire(&mut s, 1, 1_000_000));
    let epoch = s.map.epoch;
    handover(&mut s, 4).unwrap();
    release(&mut s, 1, l.generation);
    assert_eq!((home(&s), s.map.epoch), (Some("z1"), epoch), "same zone");
    assert!(s.vdis["vm"].past_homes.is_empty());
    // Nobody holds the lock: a hand-over to another zone moves the home at once.
    handover(&mut s, 2).unwrap();
    assert_eq!((home(&s), s.map.epoch), (Some("z2"), Epoch(epoch.0 + 1)));
}

#[test]
fn test_a_holder_whose_lease_ran_out_does_not_move_the_home() {
    // It may have died with writes not yet shipped to the other zones: its zone's
    // copies stay first in placement, so the next holder's repair starts from them.
    let mut s = state(WritePolicy::ZoneSync);
    let l = lock(acquire(&mut s, 1, 1_000_000));
    handover(&mut s, 3).unwrap();
    let l3 = lock(acquire(&mut s, 3, 1_020_000));
    assert_eq!(l3.generation, l.generation + 1);
    assert_eq!(
        (home(&s), l3.home_zone.as_deref()),
        (Some("z1"), Some("z1"))
    );
    // A late release by the old holder changes nothing.
    release(&mut s, 1, l.generation);
    assert_eq!(home(&s), Some("z1"));
}

#[test]
fn test_promote_is_refused_while_the_home_zone_has_a_node_up_or_the_zone_cannot_hold_copies() {
    let mut s = state(WritePolicy::ZoneSync);
    lock(acquire(&mut s, 1, 1_000_000));
    let (kind, msg) = promote(&mut s, "z2").unwrap_err();
    assert_eq!(kind, ErrorKind::Locked);
    assert!(msg.contains("handover"), "{msg}");
    down(&mut s, 1);
    assert_eq!(
        promote(&mut s, "z2").unwrap_err().0,
        ErrorKind::Locked,
        "node 4 is up"
    );
    down(&mut s, 4);
    assert_eq!(promote(&mut s, "z9").unwrap_err().0, ErrorKind::NotFound);
    assert_eq!(promote(&mut s, "z1").unwrap_err().0, ErrorKind::Invalid);
    down(&mut s, 2);
    assert_eq!(promote(&mut s, "z2").unwrap_err().0, ErrorKind::Unavailable);
    assert_eq!(home(&s), Some("z1"), "nothing changed");
    let epoch = s.map.epoch;
    let v = match promote(&mut s, "z3") {
        Ok(Reply::Vdi(v)) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(v.home_zone.as_deref(), Some("z3"));
    assert_eq!(s.map.epoch, Epoch(epoch.0 + 1));
    assert_eq!(v.home_at(epoch), Some("z1"));
}

#[test]
fn test_a_zone_sync_vdi_whose_home_is_lost_is_writable_elsewhere_only_after_promote() {
    let mut s = state(WritePolicy::ZoneSync);
    let l = lock(acquire(&mut s, 1, 1_000_000));
    down(&mut s, 1);
    down(&mut s, 4);
    // The lease ran out; node 2 (zone z2) may not take it: writes may be missing.
    let (kind, msg) = acquire(&mut s, 2, 1_020_000).unwrap_err();
    assert_eq!(kind, ErrorKind::Locked);
    assert!(msg.contains("drove vdi promote vm --zone"), "{msg}");
    promote(&mut s, "z2").unwrap();
    let l2 = lock(acquire(&mut s, 2, 1_021_000));
    assert_eq!(
        (l2.generation, l2.home_zone.as_deref()),
        (l.generation + 1, Some("z2"))
    );
}

#[test]
fn test_a_sync_vdi_whose_home_is_lost_stays_writable_elsewhere() {
    // Every acknowledged write is on every copy: nothing to accept.
    let mut s = state(WritePolicy::Sync);
    let l = lock(acquire(&mut s, 1, 1_000_000));
    down(&mut s, 1);
    down(&mut s, 4);
    let l2 = lock(acquire(&mut s, 2, 1_020_000));
    assert_eq!(l2.generation, l.generation + 1);
    assert_eq!(home(&s), Some("z1"), "the home moves only by promote");
}

#[test]
fn test_the_kept_homes_are_bounded() {
    let mut s = state(WritePolicy::Sync);
    let l = lock(acquire(&mut s, 1, 1_000_000));
    release(&mut s, 1, l.generation);
    for i in 0..(MAX_PAST_HOMES + 5) {
        let to = if i % 2 == 0 { 2 } else { 1 };
        handover(&mut s, to).unwrap();
    }
    let v = &s.vdis["vm"];
    assert_eq!(v.past_homes.len(), MAX_PAST_HOMES);
    let untils: Vec<u64> = v.past_homes.iter().map(|p| p.until.0).collect();
    assert!(untils.windows(2).all(|w| w[0] < w[1]), "{untils:?}");
    assert_eq!(v.past_homes.last().unwrap().until, s.map.epoch);
}
