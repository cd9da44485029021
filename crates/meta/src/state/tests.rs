//! Unit tests of [`MetaState::apply`]: no Raft, just the pure state machine.
use super::*;
use drove_types::DEFAULT_OBJECT_SIZE;

fn node(id: u64, zone: &str) -> NodeInfo {
    NodeInfo {
        id: NodeId(id),
        zone: zone.to_string(),
        weight: 1,
        admin_addr: format!("10.0.0.{id}:7000"),
        peer_addr: format!("10.0.0.{id}:7001"),
        nbd_addr: format!("10.0.0.{id}:10809"),
        nbd_socket: format!("/run/drove/{id}.sock"),
        state: NodeState::Up,
        witness: false,
        ..NodeInfo::new(NodeId(id), zone)
    }
}

/// Apply `UpsertNode(n)` at `now`, first handing out ids up to `n.id` as joins do.
pub(super) fn add(s: &mut MetaState, n: NodeInfo, now: u64) {
    while s.next_node_id <= n.id.0 {
        s.apply(&Command::AllocateNodeId, now).unwrap();
    }
    s.apply(&Command::UpsertNode(n), now).unwrap();
}

fn with_nodes(n: u64) -> MetaState {
    let mut s = MetaState::default();
    for id in 1..=n {
        add(&mut s, node(id, "z"), 100);
    }
    s
}

fn create(name: &str, size: u64, copies: Option<u8>) -> Command {
    Command::CreateVdi {
        name: name.to_string(),
        size,
        copies,
        mode: ReplicationMode::Direct,
        object_size: DEFAULT_OBJECT_SIZE,
        now: 1234,
        home_zone: None,
        home_copies: None,
        policy: WritePolicy::Sync,
        max_lag_ms: None,
        max_lag_bytes: None,
        qos: Default::default(),
    }
}

fn err_of(r: ApplyResult) -> (ErrorKind, String) {
    r.expect_err("expected an error")
}

#[test]
fn test_default_state_counters() {
    let s = MetaState::default();
    assert_eq!(s.map.epoch, Epoch(0));
    assert_eq!(s.next_vdi_id, 1);
    assert_eq!(s.next_node_id, 2);
    assert_eq!(
        s.settings,
        Settings {
            default_copies: 3,
            max_voters: 3,
            down_after_ms: 5000,
            recovery_mib_s: 200,
            hold_down_ms: 60_000,
            noout: false,
            backfill_full_pct: 90,
            default_qos: Default::default(),
            feature_level: 1,
        }
    );
}

#[test]
fn test_noout_is_set_and_cleared_and_old_settings_read_without_it() {
    let mut s = MetaState::default();
    s.apply(&Command::SetNoout(true), 0).unwrap();
    assert!(s.settings.noout);
    // Nothing else moves: no epoch, no other setting.
    assert_eq!(s.map.epoch, Epoch(0));
    assert_eq!(s.settings.down_after_ms, 5000);
    s.apply(&Command::SetNoout(false), 0).unwrap();
    assert!(!s.settings.noout);
    // Settings written before the flag existed read as "not set".
    let old = r#"{"default_copies":3,"max_voters":3,"down_after_ms":5000,"recovery_mib_s":200}"#;
    let read: Settings = serde_json::from_str(old).unwrap();
    assert!(!read.noout);
    assert_eq!(read.hold_down_ms, 60_000);
    assert_eq!(read.backfill_full_pct, 90);
}

#[test]
fn test_backfill_full_is_a_percent() {
    let mut s = MetaState::default();
    for bad in [0, 101, 255] {
        let e = s.apply(&Command::SetBackfillFull(bad), 0).unwrap_err();
        assert_eq!(e.0, ErrorKind::Invalid, "{bad}");
        assert_eq!(
            s.settings.backfill_full_pct, 90,
            "a refused value changes nothing"
        );
    }
    s.apply(&Command::SetBackfillFull(75), 0).unwrap();
    assert_eq!(s.settings.backfill_full_pct, 75);
    s.apply(&Command::SetBackfillFull(100), 0).unwrap();
    assert_eq!(s.settings.backfill_full_pct, 100);
}

#[test]
fn test_health_settings_and_min_copies_are_checked() {
    let mut s = MetaState::default();
    let bad = Command::SetHealthSettings {
        down_after_ms: Some(100),
        recovery_mib_s: None,
        hold_down_ms: None,
    };
    assert_eq!(s.apply(&bad, 0).unwrap_err().0, ErrorKind::Invalid);
    let long_hold = Command::SetHealthSettings {
        down_after_ms: None,
        recovery_mib_s: None,
        hold_down_ms: Some(u64::MAX),
    };
    assert_eq!(s.apply(&long_hold, 0).unwrap_err().0, ErrorKind::Invalid);
    let good = Command::SetHealthSettings {
        down_after_ms: Some(2000),
        recovery_mib_s: Some(50),
        hold_down_ms: Some(10_000),
    };
    s.apply(&good, 0).unwrap();
    assert_eq!(s.settings.down_after_ms, 2000);
    assert_eq!(s.settings.recovery_mib_s, 50);
    assert_eq!(s.settings.hold_down_ms, 10_000);
    // min_copies is 1..=copies, per VDI; None restores copies - 1.
    s.map.nodes.insert(NodeId(1), node(1, "a"));
    s.map.nodes.insert(NodeId(2), node(2, "b"));
    s.apply(&create("v", 1 << 20, Some(2)), 0).unwrap();
    let set = |m| Command::SetMinCopies {
        name: "v".into(),
        min_copies: m,
    };
    assert_eq!(s.apply(&set(Some(3)), 0).unwrap_err().0, ErrorKind::Invalid);
    assert_eq!(s.apply(&set(Some(0)), 0).unwrap_err().0, ErrorKind::Invalid);
    s.apply(&set(Some(2)), 0).unwrap();
    assert_eq!(s.vdis["v"].min_copies(), 2);
    s.apply(&set(None), 0).unwrap();
    assert_eq!(s.vdis["v"].min_copies(), 1);
}

#[test]
fn test_every_epoch_record_keeps_its_map() {
    let mut s = MetaState::default();
    add(&mut s, node(1, "a"), 0);
    add(&mut s, node(2, "b"), 0);
    s.apply(
        &Command::SetNodeState {
            id: NodeId(2),
            state: NodeState::Down,
            reason: String::new(),
            hold_ms: 0,
            judged: None,
        },
        0,
    )
    .unwrap();
    let h = &*s.epoch_history;
    assert_eq!(h.len(), 3);
    for r in h {
        assert_eq!(r.map.epoch, r.epoch);
    }
    assert_eq!(h[1].map.nodes[&NodeId(2)].state, NodeState::Up);
    assert_eq!(h[2].map.nodes[&NodeId(2)].state, NodeState::Down);
}

#[test]
fn test_allocate_node_id_is_sequential() {
    let mut s = MetaState::default();
    assert_eq!(
        s.apply(&Command::AllocateNodeId, 0),
        Ok(Reply::NodeId(NodeId(2)))
    );
    assert_eq!(
        s.apply(&Command::AllocateNodeId, 0),
        Ok(Reply::NodeId(NodeId(3)))
    );
    assert_eq!(s.next_node_id, 4);
    assert_eq!(
        s.map.epoch,
        Epoch(0),
        "allocating an id is not a map change"
    );
}

#[test]
fn test_upsert_new_node_bumps_epoch_and_records_history() {
    let mut s = MetaState::default();
    add(&mut s, node(1, "a"), 50);
    assert_eq!(s.map.epoch, Epoch(1));
    assert_eq!(s.map.nodes[&NodeId(1)].zone, "a");
    assert_eq!(s.epoch_history.len(), 1);
    assert_eq!(s.epoch_history[0].epoch, Epoch(1));
    assert_eq!(s.epoch_history[0].at_unix, 50);
    assert!(s.epoch_history[0].change.contains("node 1 joined"));
}

#[test]
fn test_upsert_address_change_keeps_epoch() {
    let mut s = with_nodes(1);
    let mut n = node(1, "z");
    n.admin_addr = "10.9.9.9:7000".to_string();
    add(&mut s, n.clone(), 60);
    assert_eq!(s.map.epoch, Epoch(1));
    assert_eq!(s.map.nodes[&NodeId(1)].admin_addr, "10.9.9.9:7000");
    // Re-applying the same record changes nothing.
    add(&mut s, n, 61);
    assert_eq!(s.map.epoch, Epoch(1));
    assert_eq!(s.epoch_history.len(), 1);
}

#[test]
fn test_upsert_zone_weight_or_state_change_bumps_epoch() {
    let mut s = with_nodes(1);
    let mut n = node(1, "other");
    add(&mut s, n.clone(), 70);
    assert_eq!(s.map.epoch, Epoch(2));
    n.weight = 5;
    add(&mut s, n.clone(), 71);
    assert_eq!(s.map.epoch, Epoch(3));
    n.state = NodeState::Down;
    add(&mut s, n, 72);
    assert_eq!(s.map.epoch, Epoch(4));
    let changes: Vec<&str> = s.epoch_history.iter().map(|r| r.change.as_str()).collect();
    assert!(changes[1].contains("zone z -> other"), "{changes:?}");
    assert!(changes[2].contains("weight 1 -> 5"), "{changes:?}");
    assert!(changes[3].contains("Up -> Down"), "{changes:?}");
}

#[test]
fn test_set_node_state_bumps_epoch_only_on_change() {
    let mut s = with_nodes(2);
    let down = Command::SetNodeState {
        id: NodeId(2),
        state: NodeState::Down,
        reason: String::new(),
        hold_ms: 0,
        judged: None,
    };
    s.apply(&down, 80).unwrap();
    assert_eq!(s.map.epoch, Epoch(3));
    assert_eq!(s.map.nodes[&NodeId(2)].state, NodeState::Down);
    s.apply(&down, 81).unwrap();
    assert_eq!(s.map.epoch, Epoch(3));
    assert_eq!(s.epoch_history.len(), 3);
}

fn verdict(id: u64, state: NodeState, judged: Option<(u64, u64)>) -> Command {
    Command::SetNodeState {
        id: NodeId(id),
        state,
        reason: "by a gateway".into(),
        hold_ms: 0,
        judged: judged.map(|(by, seen)| super::Judged {
            by: NodeId(by),
            seen: Epoch(seen),
        }),
    }
}

/// A gateway's verdict is refused when its judge was marked down after the map
/// it judged on (it was cut off: the seed 105 case), is down now, is unknown, or
/// judged on a map older than the history; a verdict naming a future epoch is
/// invalid. At feature level 2 the judge is not checked (an older build would
/// not check it, and every state machine must apply the same).
#[test]
fn test_a_gateways_verdict_is_refused_when_its_judge_was_down_since_its_map() {
    let mut s = with_nodes(4);
    assert!(s.settings.feature_level >= 3);
    let e = s.map.epoch.0;
    // Judged on the current map: taken.
    s.apply(&verdict(4, NodeState::Down, Some((1, e))), 90)
        .unwrap();
    assert_eq!(s.map.nodes[&NodeId(4)].state, NodeState::Down);
    // Node 1 is marked down and comes back (the detector, across a cut).
    s.apply(&verdict(1, NodeState::Down, None), 91).unwrap();
    s.apply(&verdict(1, NodeState::Up, None), 92).unwrap();
    let now = s.map.epoch.0;
    assert_eq!(now, e + 3);
    // Its verdict judged before that, committed now: refused, nothing changes.
    let before = s.clone();
    let (kind, msg) = err_of(s.apply(&verdict(3, NodeState::Down, Some((1, e + 1))), 93));
    assert_eq!(kind, ErrorKind::StaleEpoch, "{msg}");
    assert!(
        msg.contains(&format!("node 1 was down at epoch {}", e + 2)),
        "{msg}"
    );
    assert_eq!(s, before);
    // Judged again on the map after its return: taken.
    s.apply(&verdict(3, NodeState::Down, Some((1, now))), 94)
        .unwrap();
    assert_eq!(s.map.nodes[&NodeId(3)].state, NodeState::Down);
    let now = s.map.epoch.0;
    // A judge that is down now, or unknown; a map from the future.
    let (kind, msg) = err_of(s.apply(&verdict(2, NodeState::Down, Some((4, now))), 95));
    assert_eq!(kind, ErrorKind::StaleEpoch);
    assert!(msg.contains("node 4 is down now"), "{msg}");
    let (kind, msg) = err_of(s.apply(&verdict(2, NodeState::Down, Some((9, now))), 95));
    assert_eq!(kind, ErrorKind::StaleEpoch);
    assert!(msg.contains("node 9 is not in the cluster"), "{msg}");
    let (kind, msg) = err_of(s.apply(&verdict(2, NodeState::Down, Some((1, now + 1))), 95));
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("and the cluster is at epoch"), "{msg}");
    // A map older than the history's first epoch: nobody can tell, refused.
    s.apply(&verdict(3, NodeState::Up, None), 96).unwrap();
    s.apply(&verdict(4, NodeState::Up, None), 96).unwrap();
    let now = s.map.epoch;
    s.apply(&Command::TrimHistory { keep_from: now }, 97)
        .unwrap();
    let (kind, msg) = err_of(s.apply(&verdict(2, NodeState::Down, Some((1, now.0 - 1))), 98));
    assert_eq!(kind, ErrorKind::StaleEpoch);
    assert!(msg.contains("no longer known"), "{msg}");
    s.apply(&verdict(2, NodeState::Down, Some((1, now.0))), 98)
        .unwrap();
    // At feature level 2 the same stale verdict is applied, as before.
    let mut old = with_nodes(4);
    old.settings.feature_level = 2;
    let e = old.map.epoch.0;
    old.apply(&verdict(1, NodeState::Down, None), 91).unwrap();
    old.apply(&verdict(1, NodeState::Up, None), 92).unwrap();
    old.apply(&verdict(3, NodeState::Down, Some((1, e))), 93)
        .unwrap();
    assert_eq!(old.map.nodes[&NodeId(3)].state, NodeState::Down);
}

/// From feature level 4 a verdict on a node of another zone is refused when
/// another node of the judge's zone was marked down since its map: the judge was
/// likely cut off with its zone (raft seed 4181). A verdict on its own zone, or
/// judged on a map after the mark-down, is taken; at level 3 the rule is not
/// applied (an older build would not apply it).
#[test]
fn test_a_verdict_across_zones_is_refused_when_the_judges_zone_lost_a_node_since_its_map() {
    let build = |level: u32| {
        let mut s = MetaState::default();
        for (id, zone) in [(1, "z1"), (2, "z1"), (3, "z2"), (4, "z2"), (5, "z3")] {
            add(&mut s, node(id, zone), 100);
        }
        s.settings.feature_level = level;
        s
    };
    let mut s = build(4);
    let e = s.map.epoch.0;
    // The other side marks node 4 down (node 3's zone-mate), judged by node 1.
    s.apply(&verdict(4, NodeState::Down, Some((1, e))), 90)
        .unwrap();
    // Node 3's verdict on node 1, judged on the map before: refused.
    let before = s.clone();
    let (kind, msg) = err_of(s.apply(&verdict(1, NodeState::Down, Some((3, e))), 91));
    assert_eq!(kind, ErrorKind::StaleEpoch, "{msg}");
    assert!(
        msg.contains(&format!(
            "node 4, in the same zone as node 3, was marked down at epoch {}",
            e + 1
        )),
        "{msg}"
    );
    assert_eq!(s, before);
    // On its own zone, or on another zone from a map after the mark-down: taken.
    let mut own = s.clone();
    own.apply(&verdict(4, NodeState::Up, None), 92).unwrap();
    let up = own.map.epoch.0;
    own.apply(&verdict(4, NodeState::Down, Some((3, up))), 93)
        .unwrap();
    assert_eq!(own.map.nodes[&NodeId(4)].state, NodeState::Down);
    s.apply(&verdict(1, NodeState::Down, Some((3, e + 1))), 92)
        .unwrap();
    assert_eq!(s.map.nodes[&NodeId(1)].state, NodeState::Down);
    // A zone-mate down already in the judge's map does not count.
    let now = s.map.epoch.0;
    s.apply(&verdict(2, NodeState::Down, Some((3, now))), 93)
        .unwrap();
    // At level 3 the same verdict as above is taken.
    let mut old = build(3);
    old.apply(&verdict(4, NodeState::Down, Some((1, e))), 90)
        .unwrap();
    old.apply(&verdict(1, NodeState::Down, Some((3, e))), 91)
        .unwrap();
    assert_eq!(old.map.nodes[&NodeId(1)].state, NodeState::Down);
}

#[test]
fn test_set_node_state_unknown_node_is_not_found() {
    let mut s = with_nodes(1);
    let before = s.clone();
    let (kind, _) = err_of(s.apply(
        &Command::SetNodeState {
            id: NodeId(9),
            state: NodeState::Down,
            reason: String::new(),
            hold_ms: 0,
            judged: None,
        },
        0,
    ));
    assert_eq!(kind, ErrorKind::NotFound);
    assert_eq!(s, before);
}

#[test]
fn test_create_vdi_assigns_ids_and_defaults() {
    let mut s = with_nodes(3);
    let Ok(Reply::Vdi(a)) = s.apply(&create("a", 1 << 30, None), 0) else {
        panic!("create a failed");
    };
    assert_eq!(a.id, VdiId(1));
    assert_eq!(a.copies, 3);
    assert_eq!(a.created, 1234);
    assert_eq!(a.object_size, DEFAULT_OBJECT_SIZE);
    let Ok(Reply::Vdi(b)) = s.apply(&create("b", 512, Some(2)), 0) else {
        panic!("create b failed");
    };
    assert_eq!(b.id, VdiId(2));
    assert_eq!(b.copies, 2);
    assert_eq!(s.vdis.len(), 2);
    assert_eq!(s.next_vdi_id, 3);
}

#[test]
fn test_vdi_ids_are_never_reused() {
    let mut s = with_nodes(3);
    s.apply(&create("a", 4096, None), 0).unwrap();
    s.apply(
        &Command::DeleteVdi {
            name: "a".to_string(),
            force: false,
        },
        0,
    )
    .unwrap();
    let Ok(Reply::Vdi(again)) = s.apply(&create("a", 4096, None), 0) else {
        panic!("re-create failed");
    };
    assert_eq!(again.id, VdiId(2));
}

#[test]
fn test_create_duplicate_name_is_already_exists() {
    let mut s = with_nodes(3);
    s.apply(&create("x", 4096, None), 0).unwrap();
    let before = s.clone();
    let (kind, msg) = err_of(s.apply(&create("x", 8192, None), 0));
    assert_eq!(kind, ErrorKind::AlreadyExists);
    assert_eq!(msg, "VDI 'x' already exists");
    assert_eq!(s, before);
}

#[test]
fn test_create_rejects_bad_sizes() {
    let mut s = with_nodes(3);
    for size in [0, 511, 513, MAX_VDI_SIZE + 512] {
        let (kind, msg) = err_of(s.apply(&create("v", size, None), 0));
        assert_eq!(kind, ErrorKind::Invalid, "size {size}: {msg}");
    }
    assert!(s.apply(&create("v", MAX_VDI_SIZE, None), 0).is_ok());
    assert!(
        s.vdis.len() == 1 && s.next_vdi_id == 2,
        "failed creates used no id"
    );
}

#[test]
fn test_create_rejects_bad_object_size_and_too_many_objects() {
    let mut s = with_nodes(3);
    for object_size in [0, 1000, 2048, 3 << 20, 1 << 31] {
        let cmd = Command::CreateVdi {
            name: "v".to_string(),
            size: 1 << 20,
            copies: None,
            mode: ReplicationMode::Direct,
            object_size,
            now: 0,
            home_zone: None,
            home_copies: None,
            policy: WritePolicy::Sync,
            max_lag_ms: None,
            max_lag_bytes: None,
            qos: Default::default(),
        };
        let (kind, _) = err_of(s.apply(&cmd, 0));
        assert_eq!(kind, ErrorKind::Invalid, "object size {object_size}");
    }
    // 1 PiB in 4 KiB objects needs 2^38 objects: more than an object index holds.
    let cmd = Command::CreateVdi {
        name: "v".to_string(),
        size: MAX_VDI_SIZE,
        copies: None,
        mode: ReplicationMode::Direct,
        object_size: 4096,
        now: 0,
        home_zone: None,
        home_copies: None,
        policy: WritePolicy::Sync,
        max_lag_ms: None,
        max_lag_bytes: None,
        qos: Default::default(),
    };
    assert_eq!(err_of(s.apply(&cmd, 0)).0, ErrorKind::Invalid);
}

#[test]
fn test_create_rejects_copies_out_of_range() {
    let mut s = with_nodes(5);
    for copies in [0, 6, 255] {
        let (kind, _) = err_of(s.apply(&create("v", 4096, Some(copies)), 0));
        assert_eq!(kind, ErrorKind::Invalid, "copies {copies}");
    }
    assert!(s.apply(&create("v", 4096, Some(5)), 0).is_ok());
}

#[test]
fn test_create_needs_enough_up_nodes() {
    let mut s = with_nodes(2);
    let (kind, msg) = err_of(s.apply(&create("v", 4096, Some(3)), 0));
    assert_eq!(kind, ErrorKind::Invalid);
    assert_eq!(msg, "copies=3 needs at least 3 nodes, the cluster has 2");
    // The default (3) is checked the same way.
    assert_eq!(
        err_of(s.apply(&create("v", 4096, None), 0)).0,
        ErrorKind::Invalid
    );
    // Down nodes do not count.
    let mut s = with_nodes(3);
    s.apply(
        &Command::SetNodeState {
            id: NodeId(3),
            state: NodeState::Down,
            reason: String::new(),
            hold_ms: 0,
            judged: None,
        },
        0,
    )
    .unwrap();
    let (_, msg) = err_of(s.apply(&create("v", 4096, None), 0));
    assert_eq!(msg, "copies=3 needs at least 3 nodes, the cluster has 2");
}

#[test]
fn test_create_rejects_bad_names() {
    let mut s = with_nodes(3);
    for name in ["", ".hidden", "-x", "a/b", "sp ace"] {
        let (kind, _) = err_of(s.apply(&create(name, 4096, None), 0));
        assert_eq!(kind, ErrorKind::Invalid, "name {name:?}");
    }
}

#[test]
fn test_delete_unknown_vdi_is_not_found() {
    let mut s = with_nodes(3);
    let (kind, msg) = err_of(s.apply(
        &Command::DeleteVdi {
            name: "nope".to_string(),
            force: false,
        },
        0,
    ));
    assert_eq!(kind, ErrorKind::NotFound);
    assert_eq!(msg, "No VDI named 'nope'");
}

#[test]
fn test_resize_grows_only() {
    let mut s = with_nodes(3);
    s.apply(&create("v", 1 << 20, None), 0).unwrap();
    let grow = Command::ResizeVdi {
        name: "v".to_string(),
        size: 2 << 20,
    };
    let Ok(Reply::Vdi(v)) = s.apply(&grow, 0) else {
        panic!("grow failed");
    };
    assert_eq!(v.size, 2 << 20);
    assert_eq!(s.vdis["v"].size, 2 << 20);
    // Same size is a no-op, not an error.
    assert!(s.apply(&grow, 0).is_ok());
    let shrink = Command::ResizeVdi {
        name: "v".to_string(),
        size: 1 << 20,
    };
    assert_eq!(err_of(s.apply(&shrink, 0)).0, ErrorKind::Invalid);
    let odd = Command::ResizeVdi {
        name: "v".to_string(),
        size: (4 << 20) + 1,
    };
    assert_eq!(err_of(s.apply(&odd, 0)).0, ErrorKind::Invalid);
    let huge = Command::ResizeVdi {
        name: "v".to_string(),
        size: MAX_VDI_SIZE * 2,
    };
    assert_eq!(err_of(s.apply(&huge, 0)).0, ErrorKind::Invalid);
    let missing = Command::ResizeVdi {
        name: "w".to_string(),
        size: 4096,
    };
    assert_eq!(err_of(s.apply(&missing, 0)).0, ErrorKind::NotFound);
    assert_eq!(s.vdis["v"].size, 2 << 20);
}

#[test]
fn test_grow_adds_to_the_size_each_time_it_is_applied() {
    let mut s = with_nodes(3);
    s.apply(&create("v", 1 << 20, None), 0).unwrap();
    let grow = |by| Command::GrowVdi {
        name: "v".to_string(),
        by,
    };
    s.apply(&grow(1 << 20), 0).unwrap();
    let Ok(Reply::Vdi(v)) = s.apply(&grow(1 << 20), 0) else {
        panic!("grow failed");
    };
    assert_eq!(v.size, 3 << 20);
    assert_eq!(err_of(s.apply(&grow(u64::MAX), 0)).0, ErrorKind::Invalid);
    assert_eq!(
        err_of(s.apply(&grow(MAX_VDI_SIZE), 0)).0,
        ErrorKind::Invalid
    );
    assert_eq!(err_of(s.apply(&grow(1), 0)).0, ErrorKind::Invalid);
    let missing = Command::GrowVdi {
        name: "w".to_string(),
        by: 4096,
    };
    assert_eq!(err_of(s.apply(&missing, 0)).0, ErrorKind::NotFound);
    assert_eq!(s.vdis["v"].size, 3 << 20);
}

#[test]
fn test_set_default_copies() {
    let mut s = with_nodes(1);
    assert_eq!(
        err_of(s.apply(&Command::SetDefaultCopies(0), 0)).0,
        ErrorKind::Invalid
    );
    assert_eq!(
        err_of(s.apply(&Command::SetDefaultCopies(6), 0)).0,
        ErrorKind::Invalid
    );
    s.apply(&Command::SetDefaultCopies(1), 0).unwrap();
    assert_eq!(s.settings.default_copies, 1);
    let Ok(Reply::Vdi(v)) = s.apply(&create("solo", 4096, None), 0) else {
        panic!("create with default 1 failed");
    };
    assert_eq!(v.copies, 1);
}

#[test]
fn test_apply_is_deterministic_across_replicas() {
    let cmds = [
        Command::UpsertNode(node(1, "a")),
        Command::AllocateNodeId,
        Command::UpsertNode(node(2, "b")),
        Command::SetNodeState {
            id: NodeId(2),
            state: NodeState::Down,
            reason: String::new(),
            hold_ms: 0,
            judged: None,
        },
        create("bad", 4096, Some(2)),
        Command::SetNodeState {
            id: NodeId(2),
            state: NodeState::Up,
            reason: String::new(),
            hold_ms: 0,
            judged: None,
        },
        create("good", 4096, Some(2)),
        Command::ResizeVdi {
            name: "good".to_string(),
            size: 8192,
        },
    ];
    let mut a = MetaState::default();
    let mut b = MetaState::default();
    let ra: Vec<ApplyResult> = cmds
        .iter()
        .enumerate()
        .map(|(i, c)| a.apply(c, i as u64))
        .collect();
    let rb: Vec<ApplyResult> = cmds
        .iter()
        .enumerate()
        .map(|(i, c)| b.apply(c, i as u64))
        .collect();
    assert_eq!(ra, rb);
    assert_eq!(a, b);
    assert!(ra[4].is_err() && ra[6].is_ok());
    assert_eq!(a.map.epoch, Epoch(4));
}

#[test]
fn test_state_round_trips_through_json() {
    let mut s = with_nodes(3);
    s.apply(&create("v", 4096, None), 9).unwrap();
    let bytes = serde_json::to_vec(&s).unwrap();
    let back: MetaState = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(back, s);
}

#[test]
fn test_only_a_drained_or_down_node_is_removed() {
    let mut s = with_nodes(3);
    let remove = |id| Command::RemoveNode { id: NodeId(id) };
    let before = s.clone();
    let (kind, msg) = err_of(s.apply(&remove(2), 50));
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("node leave 2"), "{msg}");
    assert_eq!(s, before);
    assert_eq!(err_of(s.apply(&remove(9), 50)).0, ErrorKind::NotFound);
    // Drained (weight 0): removed, with an epoch of its own.
    let mut drained = node(2, "z");
    drained.weight = 0;
    add(&mut s, drained, 51);
    s.apply(&remove(2), 52).unwrap();
    assert!(s.map.node(NodeId(2)).is_none());
    assert_eq!(s.map.epoch, Epoch(5));
    assert!(s
        .epoch_history
        .last()
        .unwrap()
        .change
        .contains("node 2 removed"));
    // Down: removed too.
    s.apply(
        &Command::SetNodeState {
            id: NodeId(3),
            state: NodeState::Down,
            reason: String::new(),
            hold_ms: 0,
            judged: None,
        },
        53,
    )
    .unwrap();
    s.apply(&remove(3), 54).unwrap();
    assert_eq!(
        s.map.nodes.keys().copied().collect::<Vec<_>>(),
        vec![NodeId(1)]
    );
}

#[test]
fn test_a_node_record_with_an_id_never_handed_out_or_bad_addresses_is_refused() {
    let mut s = with_nodes(2);
    let before = s.clone();
    let bad = [
        NodeInfo {
            id: NodeId(99),
            ..node(99, "z")
        },
        NodeInfo {
            peer_addr: "evil.example:1".into(),
            ..node(2, "z")
        },
        NodeInfo {
            zone: "../etc".into(),
            ..node(2, "z")
        },
        NodeInfo {
            weight: u32::MAX,
            ..node(2, "z")
        },
    ];
    for n in bad {
        let (kind, msg) = s.apply(&Command::UpsertNode(n.clone()), 200).unwrap_err();
        assert_eq!(kind, ErrorKind::Invalid, "{n:?}: {msg}");
    }
    assert_eq!(s, before, "nothing changed");
}

#[test]
fn test_a_node_keeps_the_role_it_joined_with() {
    let mut s = with_nodes(2);
    let witness = NodeInfo {
        witness: true,
        weight: 0,
        nbd_addr: String::new(),
        nbd_socket: String::new(),
        ..node(3, "w")
    };
    s.apply(&Command::AllocateNodeId, 100).unwrap();
    s.apply(&Command::UpsertNode(witness.clone()), 100).unwrap();
    let before = s.clone();
    // A data node does not turn into a witness (its copies would leave placement
    // unannounced), nor a witness into a data node (it holds no copy).
    for n in [
        NodeInfo {
            witness: true,
            weight: 0,
            nbd_addr: String::new(),
            nbd_socket: String::new(),
            ..node(1, "a")
        },
        node(3, "w"),
    ] {
        let (kind, msg) = s.apply(&Command::UpsertNode(n.clone()), 200).unwrap_err();
        assert_eq!(kind, ErrorKind::Invalid, "{n:?}: {msg}");
        assert!(msg.contains("cannot come back as"), "{msg}");
    }
    assert_eq!(s, before, "nothing changed");
    // The same role with new addresses is taken.
    let moved = NodeInfo {
        admin_addr: "127.0.0.1:9999".into(),
        ..witness
    };
    s.apply(&Command::UpsertNode(moved), 300).unwrap();
    assert_eq!(s.map.node(NodeId(3)).unwrap().admin_addr, "127.0.0.1:9999");
}

#[test]
fn test_a_removed_node_never_comes_back_under_its_id() {
    let mut s = with_nodes(3);
    s.apply(
        &Command::SetNodeState {
            id: NodeId(3),
            state: NodeState::Down,
            reason: String::new(),
            hold_ms: 0,
            judged: None,
        },
        300,
    )
    .unwrap();
    s.apply(&Command::RemoveNode { id: NodeId(3) }, 301)
        .unwrap();
    assert!(s.removed.contains(&NodeId(3)));
    let (kind, msg) = s
        .apply(&Command::UpsertNode(node(3, "z")), 302)
        .unwrap_err();
    assert_eq!(kind, ErrorKind::Gone);
    assert!(msg.contains("empty its data directory"), "{msg}");
    assert!(s.map.node(NodeId(3)).is_none());
}

#[test]
fn test_a_silent_node_is_held_down_and_the_reason_is_in_the_history() {
    let mut s = with_nodes(3);
    s.apply(
        &Command::SetNodeState {
            id: NodeId(3),
            state: NodeState::Down,
            reason: "by gateway node 1: node 3 said nothing for 520 ms".into(),
            hold_ms: 60_000,
            judged: None,
        },
        1_000,
    )
    .unwrap();
    assert_eq!(s.held_down.get(&NodeId(3)), Some(&1_060_000));
    let last = s.epoch_history.last().unwrap();
    assert!(
        last.change
            .contains("Up -> Down (by gateway node 1: node 3 said nothing"),
        "{}",
        last.change
    );
    // Coming back up clears the hold.
    s.apply(
        &Command::JudgeNodeState {
            id: NodeId(3),
            state: NodeState::Up,
            term: 0,
        },
        1_061,
    )
    .unwrap();
    assert!(s.held_down.is_empty());
    // A verdict with an absurd hold is refused.
    let bad = Command::SetNodeState {
        id: NodeId(2),
        state: NodeState::Down,
        reason: String::new(),
        hold_ms: u64::MAX,
        judged: None,
    };
    assert_eq!(s.apply(&bad, 1_100).unwrap_err().0, ErrorKind::Invalid);
}

#[test]
fn test_rename_moves_the_record_and_keeps_id_and_lineage() {
    let mut s = with_nodes(3);
    s.apply(&create("v", 1 << 20, None), 0).unwrap();
    s.apply(&create("other", 1 << 20, None), 0).unwrap();
    let id = s.vdis["v"].id;
    let rename = |name: &str, to: &str| Command::RenameVdi {
        name: name.to_string(),
        to: to.to_string(),
    };
    let Ok(Reply::Vdi(v)) = s.apply(&rename("v", "w"), 0) else {
        panic!("rename failed");
    };
    assert_eq!((v.name.as_str(), v.id), ("w", id));
    assert!(!s.vdis.contains_key("v"));
    assert_eq!(s.vdis["w"].id, id);
    assert_eq!(s.vdis["w"].name, "w");
    // To its own name: nothing changes. Taken, missing or bad names are refused
    // and change nothing.
    assert!(s.apply(&rename("w", "w"), 0).is_ok());
    assert_eq!(
        err_of(s.apply(&rename("w", "other"), 0)).0,
        ErrorKind::AlreadyExists
    );
    assert_eq!(err_of(s.apply(&rename("v", "x"), 0)).0, ErrorKind::NotFound);
    assert_eq!(
        err_of(s.apply(&rename("w", "a/b"), 0)).0,
        ErrorKind::Invalid
    );
    assert_eq!(err_of(s.apply(&rename("w", ""), 0)).0, ErrorKind::Invalid);
    assert_eq!(s.vdis.len(), 2);
    assert_eq!(s.vdis["w"].id, id);
}

#[test]
fn test_verdicts_on_many_nodes_make_one_epoch_and_a_bad_one_changes_nothing() {
    let mut s = with_nodes(6);
    let e0 = s.map.epoch;
    let down = |ids: &[u64]| Command::JudgeNodes {
        verdicts: ids.iter().map(|&i| (NodeId(i), NodeState::Down)).collect(),
        term: 1,
    };
    // A datacenter of three nodes lost: one epoch, not three.
    s.apply(&down(&[4, 5, 6]), 200).unwrap();
    assert_eq!(s.map.epoch, Epoch(e0.0 + 1));
    for i in 4..=6 {
        assert_eq!(s.map.nodes[&NodeId(i)].state, NodeState::Down);
    }
    let last = s.epoch_history.last().unwrap();
    assert!(last.change.contains("node 4 Up -> Down"), "{}", last.change);
    assert!(last.change.contains("node 6 Up -> Down"), "{}", last.change);
    assert_eq!(last.map.epoch, s.map.epoch);
    // Nothing changes: no epoch.
    s.apply(&down(&[4, 5]), 201).unwrap();
    assert_eq!(s.map.epoch, Epoch(e0.0 + 1));
    // Refused whole: a node twice, a node not in the cluster, an empty batch, too many.
    let before = s.clone();
    let twice = Command::JudgeNodes {
        verdicts: vec![(NodeId(1), NodeState::Down), (NodeId(1), NodeState::Up)],
        term: 1,
    };
    assert_eq!(err_of(s.apply(&twice, 202)).0, ErrorKind::Invalid);
    let unknown = Command::JudgeNodes {
        verdicts: vec![(NodeId(2), NodeState::Down), (NodeId(99), NodeState::Down)],
        term: 1,
    };
    assert_eq!(err_of(s.apply(&unknown, 202)).0, ErrorKind::NotFound);
    assert_eq!(err_of(s.apply(&down(&[]), 202)).0, ErrorKind::Invalid);
    let many = Command::JudgeNodes {
        verdicts: (0..=MAX_VERDICTS as u64)
            .map(|i| (NodeId(i), NodeState::Down))
            .collect(),
        term: 1,
    };
    assert_eq!(err_of(s.apply(&many, 202)).0, ErrorKind::Invalid);
    assert_eq!(s, before, "a refused batch changed the state");
    // Coming back up in one batch clears holds, in one epoch.
    s.held_down.insert(NodeId(5), u64::MAX);
    let up = Command::JudgeNodes {
        verdicts: (4..=6).map(|i| (NodeId(i), NodeState::Up)).collect(),
        term: 1,
    };
    s.apply(&up, 203).unwrap();
    assert_eq!(s.map.epoch, Epoch(e0.0 + 2));
    assert!(s.held_down.is_empty());
}

#[test]
fn test_the_history_is_trimmed_only_to_an_epoch_every_node_was_up_at() {
    let mut s = with_nodes(3);
    let all_up = s.map.epoch;
    let judge = |id: u64, state| Command::JudgeNodes {
        verdicts: vec![(NodeId(id), state)],
        term: 1,
    };
    s.apply(&judge(2, NodeState::Down), 200).unwrap();
    let down = s.map.epoch;
    s.apply(&judge(2, NodeState::Up), 201).unwrap();
    let back = s.map.epoch;
    let before = s.clone();
    let trim = |e: Epoch| Command::TrimHistory { keep_from: e };
    // Refused: an epoch at which a node was down, one not in the history (past
    // the current one, or never made), and nothing changes.
    let (kind, msg) = err_of(s.apply(&trim(down), 202));
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("Node 2 was not up"), "{msg}");
    assert_eq!(
        err_of(s.apply(&trim(Epoch(back.0 + 1)), 202)).0,
        ErrorKind::Invalid
    );
    assert_eq!(err_of(s.apply(&trim(Epoch(0)), 202)).0, ErrorKind::Invalid);
    assert_eq!(s, before, "a refused trim changed the state");
    // Trimmed to an epoch all were up at: it and what follows are kept.
    s.apply(&trim(all_up), 203).unwrap();
    assert_eq!(s.epoch_history.first().unwrap().epoch, all_up);
    assert_eq!(s.epoch_history.len() as u64, back.0 - all_up.0 + 1);
    s.apply(&trim(back), 204).unwrap();
    assert_eq!(s.epoch_history.len(), 1);
    // What changed is still told, without the maps.
    let changes = s.epoch_changes();
    assert_eq!(changes.len() as u64, back.0);
    assert!(
        changes
            .iter()
            .any(|c| c.change.contains("node 2 Up -> Down")),
        "{changes:?}"
    );
    assert_eq!(changes.last().unwrap().epoch, back);
    assert_eq!(s.epoch_history[0].epoch, back);
    assert_eq!(s.epoch_history[0].map, s.map);
    // Trimming to the first record kept again changes nothing; the map and the
    // epochs still to come are untouched.
    let kept = s.clone();
    s.apply(&trim(back), 205).unwrap();
    assert_eq!(s, kept);
    s.apply(&judge(3, NodeState::Down), 206).unwrap();
    assert_eq!(s.map.epoch, Epoch(back.0 + 1));
    assert_eq!(s.epoch_history.len(), 2);
    // The notes kept are bounded: the oldest go first.
    let mut many = s.clone();
    for i in 0..MAX_TRIMMED_NOTES as u64 + 10 {
        let (id, state) = if i % 2 == 0 {
            (3, NodeState::Up)
        } else {
            (3, NodeState::Down)
        };
        many.apply(&judge(id, state), 300 + i).unwrap();
        if state == NodeState::Up {
            many.apply(&trim(many.map.epoch), 300 + i).unwrap();
        }
    }
    assert_eq!(many.trimmed_notes.len(), MAX_TRIMMED_NOTES);
    assert!(many
        .trimmed_notes
        .windows(2)
        .all(|w| w[0].epoch < w[1].epoch));
    // The records trimmed away are gone from the state's JSON (its snapshot).
    let json = serde_json::to_string(&s).unwrap();
    let again: MetaState = serde_json::from_str(&json).unwrap();
    assert_eq!(again, s);
}

/// Node `id` as `drove node run --witness` records it.
fn witness(id: u64, zone: &str) -> NodeInfo {
    NodeInfo {
        weight: 0,
        nbd_addr: String::new(),
        nbd_socket: String::new(),
        witness: true,
        ..node(id, zone)
    }
}

#[test]
fn test_a_witness_joins_without_nbd_and_counts_for_no_copy_nor_home() {
    let mut s = with_nodes(2);
    add(&mut s, witness(3, "w"), 100);
    assert!(s.map.nodes[&NodeId(3)].witness);
    assert_eq!(
        s.epoch_history.last().unwrap().change,
        "node 3 joined (zone w, witness)"
    );
    // Three nodes up, but the witness holds no copy.
    let (_, msg) = err_of(s.apply(&create("v", 4096, Some(3)), 0));
    assert_eq!(
        msg,
        "copies=3 needs at least 3 nodes, the cluster has 2 (witnesses hold no data)"
    );
    // Its zone cannot be a home zone.
    let mut c = create("v", 4096, Some(2));
    if let Command::CreateVdi { home_zone, .. } = &mut c {
        *home_zone = Some("w".to_string());
    }
    let (_, msg) = err_of(s.apply(&c, 0));
    assert_eq!(
        msg,
        "Zone 'w' holds only a witness, which stores no data; the zones of data nodes are: z"
    );
    s.apply(&create("v", 4096, Some(2)), 0).unwrap();
    // A witness with weight, or with an NBD address, is refused.
    let (_, msg) = err_of(s.apply(
        &Command::UpsertNode(NodeInfo {
            weight: 5,
            ..witness(3, "w")
        }),
        0,
    ));
    assert!(msg.contains("a witness holds no data"), "{msg}");
    let (_, msg) = err_of(s.apply(
        &Command::UpsertNode(NodeInfo {
            nbd_addr: "10.0.0.3:10809".to_string(),
            ..witness(3, "w")
        }),
        0,
    ));
    assert!(msg.contains("a witness serves no NBD"), "{msg}");
    // A data node must still have an NBD address.
    let (_, msg) = err_of(s.apply(
        &Command::UpsertNode(NodeInfo {
            nbd_addr: String::new(),
            ..node(2, "z")
        }),
        0,
    ));
    assert!(msg.contains("Bad NBD address"), "{msg}");
}

/// A node as the release before feature levels records itself: no level, no version.
fn old_node(id: u64, zone: &str) -> NodeInfo {
    NodeInfo {
        features: 0,
        version: String::new(),
        ..node(id, zone)
    }
}

#[test]
fn test_a_new_cluster_starts_at_its_first_nodes_feature_level() {
    let mut s = with_nodes(2);
    assert_eq!(s.settings.feature_level, drove_types::FEATURE_LEVEL);
    let limit = drove_types::Qos {
        write_iops: Some(100),
        ..Default::default()
    };
    s.apply(&Command::SetDefaultQos(limit), 101).unwrap();
    // A node of an older build may not join it: it could not read that command.
    s.apply(&Command::AllocateNodeId, 102).unwrap();
    let (kind, msg) = err_of(s.apply(&Command::UpsertNode(old_node(3, "z")), 102));
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(
        msg.contains(&format!(
            "Node 3 runs a build of cluster feature level 1, and the cluster is at level {}",
            drove_types::FEATURE_LEVEL
        )),
        "{msg}"
    );
    assert!(!s.map.nodes.contains_key(&NodeId(3)));
}

#[test]
fn test_a_cluster_begun_before_levels_uses_new_commands_only_after_upgrade_finish() {
    // Replaying a log written by the release before levels: its nodes say nothing.
    let mut s = MetaState::default();
    add(&mut s, old_node(1, "z1"), 100);
    add(&mut s, old_node(2, "z2"), 100);
    assert_eq!(s.settings.feature_level, 1);
    let limit = drove_types::Qos {
        write_iops: Some(100),
        ..Default::default()
    };
    s.apply(&create("disk", 1 << 30, Some(2)), 101).unwrap();
    let mut capped = create("capped", 1 << 30, Some(2));
    if let Command::CreateVdi { qos, .. } = &mut capped {
        *qos = limit;
    }
    let before = s.clone();
    for cmd in [
        Command::SetVdiQos {
            name: "disk".into(),
            qos: limit,
        },
        Command::SetDefaultQos(limit),
        capped,
    ] {
        let (kind, msg) = err_of(s.apply(&cmd, 102));
        assert_eq!(kind, ErrorKind::Invalid, "{cmd:?}");
        assert!(
            msg.starts_with(
                "Per-VDI I/O limits need cluster feature level 2, and the cluster is at level 1"
            ),
            "{msg}"
        );
        assert!(msg.contains("drove cluster upgrade finish"), "{msg}");
    }
    assert_eq!(s, before, "a refused command changed the state");
    // Node 1 is upgraded; node 2 is not yet: the level cannot rise.
    add(&mut s, node(1, "z1"), 103);
    let (_, msg) = err_of(s.apply(&Command::FinishUpgrade { level: 2 }, 104));
    assert!(msg.contains("node 2 knows level 1"), "{msg}");
    assert!(!msg.contains("node 1"), "{msg}");
    assert_eq!(s.settings.feature_level, 1);
    // Both upgraded: it rises, once.
    add(&mut s, node(2, "z2"), 105);
    s.apply(&Command::FinishUpgrade { level: 2 }, 106).unwrap();
    assert_eq!(s.settings.feature_level, 2);
    let (_, msg) = err_of(s.apply(&Command::FinishUpgrade { level: 2 }, 107));
    assert!(msg.contains("already at feature level 2"), "{msg}");
    s.apply(
        &Command::SetVdiQos {
            name: "disk".into(),
            qos: limit,
        },
        108,
    )
    .unwrap();
    // The level holds a node of the old build out from now on.
    let (_, msg) = err_of(s.apply(&Command::UpsertNode(old_node(2, "z2")), 109));
    assert!(msg.contains("cluster is at level 2"), "{msg}");
    // And reads back from a snapshot; a state from before levels reads as level 1.
    let json = serde_json::to_string(&s).unwrap();
    let back: MetaState = serde_json::from_str(&json).unwrap();
    assert_eq!(back.settings.feature_level, 2);
}
