//! Unit tests of the VDI write lock: lease, generation, hand-over, delete while in use.
use super::*;
use drove_types::DEFAULT_OBJECT_SIZE;

fn state() -> MetaState {
    state_with("vm")
}

/// Three nodes up in three zones and one 1 GiB VDI `name` with copies=3.
pub(crate) fn state_with(name: &str) -> MetaState {
    let mut s = MetaState::default();
    for id in 1..=3 {
        let n = NodeInfo {
            admin_addr: format!("127.0.0.1:{}", 7000 + id),
            peer_addr: format!("127.0.0.1:{}", 7100 + id),
            nbd_addr: format!("127.0.0.1:{}", 7200 + id),
            ..NodeInfo::new(NodeId(id), format!("z{id}"))
        };
        super::tests::add(&mut s, n, 100);
    }
    s.apply(
        &Command::CreateVdi {
            name: name.into(),
            size: 1 << 30,
            copies: Some(3),
            mode: ReplicationMode::Direct,
            object_size: DEFAULT_OBJECT_SIZE,
            now: 100,
            home_zone: None,
            home_copies: None,
            policy: WritePolicy::Sync,
            max_lag_ms: None,
            max_lag_bytes: None,
            qos: Default::default(),
        },
        100,
    )
    .unwrap();
    s
}

pub(crate) fn acquire(s: &mut MetaState, node: u64, now_ms: u64) -> ApplyResult {
    acquire_as(s, node, 0, now_ms)
}

/// Acquire for `node`'s run `incarnation`.
fn acquire_as(s: &mut MetaState, node: u64, incarnation: u64, now_ms: u64) -> ApplyResult {
    s.apply(
        &Command::AcquireLock {
            vdi: "vm".into(),
            node: NodeId(node),
            now_ms,
            lease_ms: 10_000,
            incarnation,
        },
        now_ms / 1000,
    )
}

fn release(s: &mut MetaState, node: u64, generation: u64) {
    s.apply(
        &Command::ReleaseLock {
            vdi: "vm".into(),
            node: NodeId(node),
            generation,
        },
        0,
    )
    .unwrap();
}

fn settled(s: &MetaState) -> u64 {
    s.settled.get(&s.vdis["vm"].id).copied().unwrap_or(0)
}

#[test]
fn test_a_clean_release_settles_a_crash_does_not_until_the_next_holder_repairs() {
    let mut s = state();
    let id = s.vdis["vm"].id;
    let l1 = lock_of(acquire(&mut s, 1, 1_000_000));
    release(&mut s, 1, l1.generation);
    assert_eq!(settled(&s), 1, "flushed and released");
    // Holder 2 dies mid-write: its lease runs out unreleased.
    let l2 = lock_of(acquire(&mut s, 2, 1_001_000));
    assert_eq!(settled(&s), 1);
    // Holder 3 takes over: generation 2 is not settled until it repairs.
    let l3 = lock_of(acquire(&mut s, 3, 1_020_000));
    assert_eq!(l3.generation, l2.generation + 1);
    assert_eq!(settled(&s), 1);
    // Only the holder of that generation may record the repair.
    let mark = |node, generation| Command::MarkSettled {
        vdi: id,
        node: NodeId(node),
        generation,
    };
    assert_eq!(s.apply(&mark(2, 2), 0).unwrap_err().0, ErrorKind::Fenced);
    assert_eq!(s.apply(&mark(3, 2), 0).unwrap_err().0, ErrorKind::Fenced);
    s.apply(&mark(3, 3), 0).unwrap();
    assert_eq!(settled(&s), 2, "every generation before 3");
    release(&mut s, 3, 3);
    assert_eq!(settled(&s), 3);
    // A holder that releases without its predecessors settled settles nothing: the
    // repair it skipped is still owed.
    let l4 = lock_of(acquire(&mut s, 1, 1_040_000));
    let l5 = lock_of(acquire(&mut s, 2, 1_060_000));
    release(&mut s, 2, l5.generation);
    assert_eq!((l4.generation, settled(&s)), (4, 3));
}

#[test]
fn test_a_restarted_node_cannot_renew_its_earlier_runs_lock() {
    let mut s = state();
    let l = lock_of(acquire_as(&mut s, 1, 111, 1_000_000));
    // Node 1 restarts (new incarnation 222): the old run may have died mid-write.
    let (kind, msg) = acquire_as(&mut s, 1, 222, 1_005_000).unwrap_err();
    assert_eq!(kind, ErrorKind::Locked);
    assert!(msg.contains("earlier run of this node"), "{msg}");
    // Once the old lease ends it gets a new generation, owing the repair.
    let l2 = lock_of(acquire_as(&mut s, 1, 222, 1_010_001));
    assert_eq!(l2.generation, l.generation + 1);
    assert_eq!(l2.incarnation, 222);
    assert_eq!(settled(&s), 0);
    // The same run renews as before.
    let l3 = lock_of(acquire_as(&mut s, 1, 222, 1_012_000));
    assert_eq!(l3.generation, l2.generation);
}

pub(crate) fn lock_of(r: ApplyResult) -> VdiLock {
    match r {
        Ok(Reply::Lock(l)) => l,
        other => panic!("expected a lock, got {other:?}"),
    }
}

#[test]
fn test_second_node_is_refused_while_the_lease_runs() {
    let mut s = state();
    let l = lock_of(acquire(&mut s, 1, 1_000_000));
    assert_eq!((l.owner, l.generation), (NodeId(1), 1));
    let (kind, msg) = acquire(&mut s, 2, 1_005_000).unwrap_err();
    assert_eq!(kind, ErrorKind::Locked);
    assert!(
        msg.contains("node 1") && msg.contains("drove vdi handover vm --to 2"),
        "{msg}"
    );
}

#[test]
fn test_renewal_keeps_the_generation_and_expiry_takes_a_new_one() {
    let mut s = state();
    lock_of(acquire(&mut s, 1, 1_000_000));
    let renewed = lock_of(acquire(&mut s, 1, 1_008_000));
    assert_eq!(renewed.generation, 1);
    assert_eq!(renewed.expires_ms, 1_018_000);
    // The lease ran out: another node takes the lock with a higher generation.
    let taken = lock_of(acquire(&mut s, 2, 1_018_001));
    assert_eq!((taken.owner, taken.generation), (NodeId(2), 2));
}

#[test]
fn test_release_then_acquire_grows_the_generation() {
    let mut s = state();
    let l = lock_of(acquire(&mut s, 1, 1_000_000));
    // A release with a wrong generation leaves the lock alone.
    s.apply(
        &Command::ReleaseLock {
            vdi: "vm".into(),
            node: NodeId(1),
            generation: 7,
        },
        1000,
    )
    .unwrap();
    assert!(acquire(&mut s, 2, 1_001_000).is_err());
    s.apply(
        &Command::ReleaseLock {
            vdi: "vm".into(),
            node: NodeId(1),
            generation: l.generation,
        },
        1001,
    )
    .unwrap();
    let l2 = lock_of(acquire(&mut s, 2, 1_001_000));
    assert_eq!(l2.generation, 2, "generations are never reused");
}

#[test]
fn test_handover_stops_renewal_and_names_the_taker() {
    let mut s = state();
    lock_of(acquire(&mut s, 1, 1_000_000));
    let l = lock_of(s.apply(
        &Command::RequestHandover {
            vdi: "vm".into(),
            to: NodeId(3),
        },
        1000,
    ));
    assert_eq!(l.handover_to, Some(NodeId(3)));
    let (kind, _) = acquire(&mut s, 1, 1_001_000).unwrap_err();
    assert_eq!(
        kind,
        ErrorKind::Locked,
        "the holder may not renew once asked"
    );
    let (_, msg) = acquire(&mut s, 3, 1_001_000).unwrap_err();
    assert!(msg.contains("hand-over to this node is under way"), "{msg}");
    let err = s
        .apply(
            &Command::RequestHandover {
                vdi: "vm".into(),
                to: NodeId(9),
            },
            1000,
        )
        .unwrap_err();
    assert_eq!(err.0, ErrorKind::NotFound);
}

#[test]
fn test_delete_is_refused_while_locked_and_allowed_after_expiry() {
    let mut s = state();
    lock_of(acquire(&mut s, 1, 1_000_000));
    let (kind, msg) = s
        .apply(
            &Command::DeleteVdi {
                name: "vm".into(),
                force: false,
            },
            1_005,
        )
        .unwrap_err();
    assert_eq!(kind, ErrorKind::Locked);
    assert!(msg.contains("in use"), "{msg}");
    s.apply(
        &Command::DeleteVdi {
            name: "vm".into(),
            force: false,
        },
        1_011,
    )
    .unwrap();
    assert!(s.locks.is_empty());
}

#[test]
fn test_an_endless_lease_or_a_wild_clock_is_refused_and_locks_nothing() {
    let mut s = state();
    let lock = |lease_ms, now_ms| Command::AcquireLock {
        vdi: "vm".into(),
        node: NodeId(1),
        now_ms,
        lease_ms,
        incarnation: 0,
    };
    // The request that once locked a VDI forever, across restarts.
    let (kind, msg) = s.apply(&lock(u64::MAX, 1_000_000), 1_000).unwrap_err();
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("lease"), "{msg}");
    // Stamped a year ahead of the log entry's time.
    let year = 365 * 24 * 3600 * 1000;
    let (_, msg) = s.apply(&lock(10_000, 1_000_000 + year), 1_000).unwrap_err();
    assert!(msg.contains("clock"), "{msg}");
    assert!(s.locks.is_empty(), "nothing was locked");
    lock_of(s.apply(&lock(10_000, 1_000_000), 1_000));
}

/// A VDI created without a home zone gets the zone of the first node to take its lock,
/// and keeps it through later locks by other nodes; a clone starts without one.
#[test]
fn test_the_first_lock_holder_gives_the_vdi_its_home_zone() {
    let mut s = state();
    assert_eq!(s.vdis["vm"].home_zone, None);
    acquire(&mut s, 2, 1_000).unwrap();
    assert_eq!(s.vdis["vm"].home_zone.as_deref(), Some("z2"));
    release(&mut s, 2, 1);
    acquire(&mut s, 3, 2_000).unwrap();
    assert_eq!(
        s.vdis["vm"].home_zone.as_deref(),
        Some("z2"),
        "only the first"
    );
    release(&mut s, 3, 2);
    s.apply(
        &Command::SnapshotVdi {
            name: "vm".into(),
            snap: "gold".into(),
            by: NodeId(3),
            now_ms: 3_000,
        },
        3,
    )
    .unwrap();
    assert_eq!(s.vdis["gold"].home_zone.as_deref(), Some("z2"));
    assert_eq!(s.vdis["vm"].home_zone.as_deref(), Some("z2"));
    s.apply(
        &Command::CloneVdi {
            snap: "gold".into(),
            name: "web".into(),
            ephemeral: false,
        },
        3,
    )
    .unwrap();
    assert_eq!(s.vdis["web"].home_zone, None);
}

/// A home zone must be a zone some node is in, and home copies 1..=copies.
#[test]
fn test_a_home_zone_must_exist_and_home_copies_fit() {
    let mut s = state();
    let create = |zone: &str, home_copies: Option<u8>| Command::CreateVdi {
        name: "h".into(),
        size: 1 << 30,
        copies: Some(3),
        mode: ReplicationMode::Direct,
        object_size: DEFAULT_OBJECT_SIZE,
        now: 100,
        home_zone: Some(zone.into()),
        home_copies,
        policy: WritePolicy::Sync,
        max_lag_ms: None,
        max_lag_bytes: None,
        qos: Default::default(),
    };
    let (kind, msg) = s.apply(&create("nowhere", None), 100).unwrap_err();
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("z1, z2, z3"), "{msg}");
    for bad in [0, 4] {
        let (kind, msg) = s.apply(&create("z1", Some(bad)), 100).unwrap_err();
        assert_eq!(kind, ErrorKind::Invalid, "{msg}");
    }
    assert!(!s.vdis.contains_key("h"), "refusals leave nothing");
    s.apply(&create("z1", Some(3)), 100).unwrap();
    assert_eq!(s.vdis["h"].home_zone.as_deref(), Some("z1"));
    assert_eq!(s.vdis["h"].home_copies, Some(3));
}

#[test]
fn test_rename_is_refused_while_a_writer_holds_the_lock_and_allowed_once_it_expires() {
    let mut s = state();
    acquire(&mut s, 1, 1_000_000).unwrap();
    let rename = Command::RenameVdi {
        name: "vm".into(),
        to: "vm2".into(),
    };
    let e = s.apply(&rename, 1_000).unwrap_err();
    assert_eq!(e.0, ErrorKind::Locked, "{}", e.1);
    assert!(s.vdis.contains_key("vm"));
    // Ten seconds later the 10 s lease has run out.
    assert!(s.apply(&rename, 1_011).is_ok());
    assert!(s.vdis.contains_key("vm2") && !s.vdis.contains_key("vm"));
}

fn break_lock(s: &mut MetaState, vdi: &str) -> ApplyResult {
    s.apply(&Command::BreakLock { vdi: vdi.into() }, 200)
}

#[test]
fn test_breaking_a_lock_fences_the_holder_and_frees_it_at_once() {
    let mut s = state();
    let Reply::Lock(held) = acquire(&mut s, 1, 200_000).unwrap() else {
        panic!("no lock")
    };
    let before = s.clone();
    let Reply::Lock(taken) = break_lock(&mut s, "vm").unwrap() else {
        panic!("the break names the lock it took")
    };
    assert_eq!(
        (taken.owner, taken.generation),
        (NodeId(1), held.generation)
    );
    // The next generation went to nobody: replicas refuse the holder's writes.
    let id = s.vdis["vm"].id;
    assert_eq!(s.lock_generations[&id], held.generation + 1);
    assert!(!s.locks.contains_key(&id));
    // Another node takes it at once, well inside the old lease.
    let Reply::Lock(next) = acquire(&mut s, 2, 201_000).unwrap() else {
        panic!("no lock for node 2")
    };
    assert_eq!(next.generation, held.generation + 2);
    assert!(s.broken.is_empty(), "a new grant forgets the break");
    // The break changed nothing but the lock, its generation and the record.
    let mut undo = s.clone();
    undo.locks = before.locks.clone();
    undo.lock_generations = before.lock_generations.clone();
    assert_eq!(undo, before);
}

#[test]
fn test_a_broken_holder_cannot_renew_or_retake_until_its_lease_is_over() {
    let mut s = state();
    acquire_as(&mut s, 1, 7, 200_000).unwrap();
    break_lock(&mut s, "vm").unwrap();
    // Its renewal inside the old lease (which ends at 210_000) is refused: it stops.
    let e = acquire_as(&mut s, 1, 7, 203_000).unwrap_err();
    assert_eq!(e.0, ErrorKind::Locked, "{e:?}");
    assert!(e.1.contains("broken"), "{e:?}");
    // A restarted process on the same node is another holder: it may take it.
    let mut other_run = s.clone();
    assert!(acquire_as(&mut other_run, 1, 8, 203_000).is_ok());
    // After the old lease, the same run may take it again (its clients attached anew).
    let Reply::Lock(l) = acquire_as(&mut s, 1, 7, 210_001).unwrap() else {
        panic!("no lock")
    };
    assert_eq!(l.generation, 3, "generation 2 went to nobody");
}

#[test]
fn test_breaking_refuses_snapshots_and_unknown_names_and_is_idempotent() {
    let mut s = state();
    assert_eq!(break_lock(&mut s, "vm"), Ok(Reply::Done), "nobody held it");
    assert_eq!(
        break_lock(&mut s, "nope").unwrap_err().0,
        ErrorKind::NotFound
    );
    s.apply(
        &Command::SnapshotVdi {
            name: "vm".into(),
            snap: "s1".into(),
            by: NodeId(1),
            now_ms: 200_000,
        },
        200,
    )
    .unwrap();
    let before = s.clone();
    assert_eq!(break_lock(&mut s, "s1").unwrap_err().0, ErrorKind::Invalid);
    assert_eq!(s, before, "a refused break changes nothing");
    acquire(&mut s, 1, 200_000).unwrap();
    break_lock(&mut s, "vm").unwrap();
    assert_eq!(break_lock(&mut s, "vm"), Ok(Reply::Done), "broken twice");
}

/// A lock taken copies no VDI record and no epoch: the new state shares both with
/// the one before (the state machine copies its state at every applied batch while
/// readers hold the old one). A change of a VDI gives a new table and leaves the old
/// state's as it was.
#[test]
fn test_a_lock_shares_the_vdi_table_with_the_state_before_and_a_resize_does_not() {
    let mut s = state();
    // The first grant gives the VDI its home zone: a change of its record.
    acquire(&mut s, 1, 1000).unwrap();
    release(&mut s, 1, 1);
    let before = s.clone();
    acquire(&mut s, 1, 2000).unwrap();
    assert_ne!(before.locks, s.locks, "the lock was taken");
    assert!(Arc::ptr_eq(&before.vdis, &s.vdis), "the table was copied");
    assert!(Arc::ptr_eq(&before.epoch_history, &s.epoch_history));
    let before = s.clone();
    s.apply(
        &Command::ResizeVdi {
            name: "vm".into(),
            size: 2 << 30,
        },
        3,
    )
    .unwrap();
    assert!(!Arc::ptr_eq(&before.vdis, &s.vdis));
    assert_eq!(
        before.vdis["vm"].size,
        1 << 30,
        "the older state keeps its table"
    );
    assert_eq!(s.vdis["vm"].size, 2 << 30);
}
