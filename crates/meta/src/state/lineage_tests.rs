//! Unit tests of snapshots, clones, rollback and the delete refusal in the VDI table.
use super::*;
use drove_types::DEFAULT_OBJECT_SIZE;

fn state() -> MetaState {
    super::lock_tests::state_with("base")
}

fn vdi(r: ApplyResult) -> VdiInfo {
    match r {
        Ok(Reply::Vdi(v)) => v,
        other => panic!("expected a VDI, got {other:?}"),
    }
}

fn snapshot(s: &mut MetaState, name: &str, snap: &str, by: u64, now_ms: u64) -> ApplyResult {
    s.apply(
        &Command::SnapshotVdi {
            name: name.into(),
            snap: snap.into(),
            by: NodeId(by),
            now_ms,
        },
        now_ms / 1000,
    )
}

fn clone(s: &mut MetaState, snap: &str, name: &str) -> ApplyResult {
    s.apply(
        &Command::CloneVdi {
            snap: snap.into(),
            name: name.into(),
            ephemeral: false,
        },
        200,
    )
}

#[test]
fn test_snapshot_freezes_the_old_id_and_gives_the_vdi_a_child_id() {
    let mut s = state();
    let before = s.vdis["base"].clone();
    let live = vdi(snapshot(&mut s, "base", "base.1", 1, 200_000));
    let frozen = &s.vdis["base.1"];
    assert_eq!(frozen.id, before.id, "the snapshot keeps the objects");
    assert!(frozen.snapshot);
    assert_ne!(live.id, before.id);
    assert_eq!(live.parent, Some(before.id));
    assert!(!live.snapshot);
    assert_eq!(s.vdis["base"], live);
    assert_eq!(s.ancestors(&live), vec![frozen.clone()]);
    // A snapshot of a snapshot is refused, as is a taken name.
    assert_eq!(
        snapshot(&mut s, "base.1", "x", 1, 200_000).unwrap_err().0,
        ErrorKind::Invalid
    );
    assert_eq!(
        snapshot(&mut s, "base", "base.1", 1, 200_000)
            .unwrap_err()
            .0,
        ErrorKind::AlreadyExists
    );
}

#[test]
fn test_snapshot_moves_the_writers_lock_and_refuses_other_nodes() {
    let mut s = state();
    let acquire = Command::AcquireLock {
        vdi: "base".into(),
        node: NodeId(2),
        now_ms: 1_000_000,
        lease_ms: 10_000,
        incarnation: 0,
    };
    s.apply(&acquire, 1_000).unwrap();
    let (kind, msg) = snapshot(&mut s, "base", "s1", 1, 1_001_000).unwrap_err();
    assert_eq!(kind, ErrorKind::Locked);
    assert!(msg.contains("node 2"), "{msg}");
    let live = vdi(snapshot(&mut s, "base", "s1", 2, 1_001_000));
    let lock = &s.locks[&live.id];
    assert_eq!(
        (lock.owner, lock.generation, lock.vdi),
        (NodeId(2), 1, live.id)
    );
    assert!(!s.locks.contains_key(&s.vdis["s1"].id));
    // Renewal by name finds the moved lock with the same generation.
    match s.apply(&acquire, 1_002).unwrap() {
        Reply::Lock(l) => assert_eq!((l.generation, l.vdi), (1, live.id)),
        other => panic!("{other:?}"),
    }
    // A lease that ran out does not stop a snapshot from another node.
    let later = vdi(snapshot(&mut s, "base", "s2", 3, 1_020_000));
    assert_eq!(later.parent, Some(live.id));
}

#[test]
fn test_clone_reads_from_a_snapshot_only() {
    let mut s = state();
    let (kind, msg) = clone(&mut s, "base", "c").unwrap_err();
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("drove vdi snapshot base"), "{msg}");
    vdi(snapshot(&mut s, "base", "gold", 1, 200_000));
    let c = vdi(clone(&mut s, "gold", "c"));
    assert_eq!(c.parent, Some(s.vdis["gold"].id));
    assert_eq!(c.size, s.vdis["gold"].size);
    assert!(!c.snapshot && !c.ephemeral);
    assert_eq!(
        clone(&mut s, "gold", "c").unwrap_err().0,
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        clone(&mut s, "nope", "d").unwrap_err().0,
        ErrorKind::NotFound
    );
}

fn del(s: &mut MetaState, n: &str) -> ApplyResult {
    s.apply(
        &Command::DeleteVdi {
            name: n.into(),
            force: false,
        },
        300,
    )
}

fn flattened(s: &mut MetaState, n: &str) {
    let id = s.vdis[n].id;
    vdi(s.apply(&Command::Flattened { name: n.into(), id }, 300));
}

#[test]
fn test_a_snapshot_others_read_from_is_deleted_by_name_and_kept_for_them() {
    let mut s = state();
    vdi(snapshot(&mut s, "base", "gold", 1, 200_000));
    vdi(clone(&mut s, "gold", "c1"));
    let gold = s.vdis["gold"].clone();
    // The disk it was taken of and a clone read from it: the name goes at once
    // (and may be taken again), the record stays for them, under a key no user
    // can name.
    assert_eq!(
        del(&mut s, "gold").unwrap(),
        Reply::Kept(vec!["base".into(), "c1".into()])
    );
    let key = drove_types::kept_name(gold.id, "gold");
    assert!(!s.vdis.contains_key("gold"));
    assert_eq!(s.vdis[&key].id, gold.id);
    assert_eq!(s.ancestors(&s.vdis["c1"].clone())[0].id, gold.id);
    assert_eq!(s.ancestors(&s.vdis["base"].clone())[0].id, gold.id);
    vdi(snapshot(&mut s, "base", "gold", 1, 200_000));
    // The kept record cannot be named: not deleted, renamed, cloned or rolled
    // back to.
    assert_eq!(del(&mut s, &key).unwrap_err().0, ErrorKind::NotFound);
    let rename = Command::RenameVdi {
        name: key.clone(),
        to: "back".into(),
    };
    assert_eq!(s.apply(&rename, 300).unwrap_err().0, ErrorKind::NotFound);
    assert_eq!(
        clone(&mut s, &key, "c2").unwrap_err().0,
        ErrorKind::NotFound
    );
    // Once nothing reads from it any more (c1 flattened, base's line moved on to a
    // newer snapshot that is flattened too), it goes, and its objects with it.
    flattened(&mut s, "c1");
    assert!(
        s.vdis.contains_key(&key),
        "base's new snapshot still reads from it"
    );
    flattened(&mut s, "gold");
    assert!(
        !s.vdis.contains_key(&key),
        "kept with nothing reading from it"
    );
    // A flatten recorded for a stale id is refused (the VDI changed meanwhile).
    let stale = Command::Flattened {
        name: "c1".into(),
        id: gold.id,
    };
    assert_eq!(s.apply(&stale, 300).unwrap_err().0, ErrorKind::Unavailable);
}

#[test]
fn test_a_chain_of_kept_snapshots_goes_when_its_last_reader_does() {
    let mut s = state();
    vdi(snapshot(&mut s, "base", "mon", 1, 200_000));
    vdi(snapshot(&mut s, "base", "tue", 1, 201_000));
    assert_eq!(
        del(&mut s, "mon").unwrap(),
        Reply::Kept(vec!["tue".into()]),
        "tue reads from mon"
    );
    assert_eq!(
        del(&mut s, "tue").unwrap(),
        Reply::Kept(vec!["base".into()])
    );
    assert_eq!(s.vdis.len(), 3, "base and the two kept snapshots");
    // Deleting the disk drops the whole chain kept for it.
    del(&mut s, "base").unwrap();
    assert!(s.vdis.is_empty(), "{:?}", s.vdis.keys().collect::<Vec<_>>());
}

#[test]
fn test_rollback_gives_a_fresh_child_of_an_ancestor_snapshot() {
    let mut s = state();
    vdi(snapshot(&mut s, "base", "s1", 1, 200_000));
    vdi(snapshot(&mut s, "base", "s2", 1, 300_000));
    s.apply(
        &Command::CreateVdi {
            name: "other".into(),
            size: 1 << 20,
            copies: Some(1),
            mode: ReplicationMode::Direct,
            object_size: DEFAULT_OBJECT_SIZE,
            now: 1,
            home_zone: None,
            home_copies: None,
            policy: WritePolicy::Sync,
            max_lag_ms: None,
            max_lag_bytes: None,
            qos: Default::default(),
        },
        1,
    )
    .unwrap();
    vdi(snapshot(&mut s, "other", "o1", 1, 300_000));
    let before = s.vdis["base"].id;
    let rb = |s: &mut MetaState, snap: &str| {
        s.apply(
            &Command::RollbackVdi {
                name: "base".into(),
                snap: snap.into(),
                now_ms: 400_000,
            },
            400,
        )
    };
    let after = vdi(rb(&mut s, "s1"));
    assert_ne!(after.id, before);
    assert_eq!(after.parent, Some(s.vdis["s1"].id));
    // The old id is gone from the table: its objects are garbage now.
    assert!(s.vdis.values().all(|v| v.id != before));
    // s2 still exists, but it is no longer an ancestor of base.
    assert_eq!(rb(&mut s, "s2").unwrap_err().0, ErrorKind::Invalid);
    assert_eq!(rb(&mut s, "o1").unwrap_err().0, ErrorKind::Invalid);
    // A writer's live lease blocks the rollback.
    s.apply(
        &Command::AcquireLock {
            vdi: "base".into(),
            node: NodeId(1),
            now_ms: 399_000,
            lease_ms: 10_000,
            incarnation: 0,
        },
        399,
    )
    .unwrap();
    assert_eq!(rb(&mut s, "s1").unwrap_err().0, ErrorKind::Locked);
}

#[test]
fn test_ephemeral_delete_only_takes_the_id_it_names() {
    let mut s = state();
    vdi(snapshot(&mut s, "base", "gold", 1, 200_000));
    let c = vdi(s.apply(
        &Command::CloneVdi {
            snap: "gold".into(),
            name: "tmp".into(),
            ephemeral: true,
        },
        200,
    ));
    assert!(c.ephemeral);
    let base = s.vdis["base"].id;
    // Not ephemeral, or another id: left alone.
    s.apply(
        &Command::DeleteEphemeral {
            name: "base".into(),
            id: base,
        },
        300,
    )
    .unwrap();
    s.apply(
        &Command::DeleteEphemeral {
            name: "tmp".into(),
            id: base,
        },
        300,
    )
    .unwrap();
    assert!(s.vdis.contains_key("base") && s.vdis.contains_key("tmp"));
    s.apply(
        &Command::DeleteEphemeral {
            name: "tmp".into(),
            id: c.id,
        },
        300,
    )
    .unwrap();
    assert!(!s.vdis.contains_key("tmp"));
}

#[test]
fn test_clone_many_makes_all_or_none() {
    let mut s = state();
    vdi(snapshot(&mut s, "base", "gold", 1, 200_000));
    vdi(clone(&mut s, "gold", "vm3"));
    let many = |s: &mut MetaState, names: &[&str]| {
        s.apply(
            &Command::CloneMany {
                snap: "gold".into(),
                names: names.iter().map(|n| n.to_string()).collect(),
                ephemeral: false,
            },
            300,
        )
    };
    let before = s.clone();
    assert_eq!(
        many(&mut s, &["vm1", "vm2", "vm3"]).unwrap_err().0,
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        many(&mut s, &["vm1", "vm1"]).unwrap_err().0,
        ErrorKind::Invalid
    );
    assert_eq!(s, before, "a refused batch leaves nothing");
    many(&mut s, &["vm1", "vm2"]).unwrap();
    let gold = s.vdis["gold"].id;
    assert_eq!(s.children_of(gold).len(), 4);
}
