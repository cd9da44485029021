//! Unit tests of write policies and lag bounds in the VDI table: set at creation,
//! changed later, refused without changing anything, inherited by clones.
use super::*;
use drove_types::{DEFAULT_MAX_LAG_BYTES, DEFAULT_OBJECT_SIZE};
use std::time::Duration;

fn state() -> MetaState {
    super::lock_tests::state_with("base")
}

fn vdi(r: ApplyResult) -> VdiInfo {
    match r {
        Ok(Reply::Vdi(v)) => v,
        other => panic!("expected a VDI, got {other:?}"),
    }
}

fn create(name: &str, policy: WritePolicy, ms: Option<u32>, bytes: Option<u64>) -> Command {
    Command::CreateVdi {
        name: name.into(),
        size: 1 << 30,
        copies: Some(3),
        mode: ReplicationMode::Direct,
        object_size: DEFAULT_OBJECT_SIZE,
        now: 100,
        home_zone: Some("z1".into()),
        home_copies: None,
        policy,
        max_lag_ms: ms,
        max_lag_bytes: bytes,
        qos: Default::default(),
    }
}

fn set(
    name: &str,
    policy: Option<WritePolicy>,
    max_lag_ms: Option<u32>,
    max_lag_bytes: Option<u64>,
) -> Command {
    Command::SetVdiPolicy {
        name: name.into(),
        policy,
        max_lag_ms,
        max_lag_bytes,
        reset_max_lag_ms: false,
        reset_max_lag_bytes: false,
    }
}

#[test]
fn test_a_lag_bound_goes_back_to_its_default_and_not_with_a_value_at_once() {
    let mut s = state();
    s.apply(
        &create("zs", WritePolicy::ZoneSync, Some(2000), Some(64 << 20)),
        100,
    )
    .unwrap();
    let reset = |ms: bool, bytes: bool, with_value: Option<u32>| Command::SetVdiPolicy {
        name: "zs".into(),
        policy: None,
        max_lag_ms: with_value,
        max_lag_bytes: None,
        reset_max_lag_ms: ms,
        reset_max_lag_bytes: bytes,
    };
    let before = s.vdis["zs"].clone();
    assert!(s.apply(&reset(true, false, Some(100)), 100).is_err());
    assert_eq!(s.vdis["zs"], before, "a refused command changes nothing");
    let v = vdi(s.apply(&reset(true, false, None), 100));
    assert_eq!((v.max_lag_ms, v.max_lag_bytes), (None, Some(64 << 20)));
    let v = vdi(s.apply(&reset(false, true, None), 100));
    assert_eq!((v.max_lag_ms, v.max_lag_bytes), (None, None));
    assert_eq!(v.max_lag(), (Duration::from_secs(5), DEFAULT_MAX_LAG_BYTES));
}

#[test]
fn test_create_stores_the_policy_and_lag_bounds() {
    let mut s = state();
    assert_eq!(s.vdis["base"].policy, WritePolicy::Sync, "the default");
    let v = vdi(s.apply(&create("zs", WritePolicy::ZoneSync, Some(2000), None), 100));
    assert_eq!(v.policy, WritePolicy::ZoneSync);
    assert_eq!(v.max_lag_ms, Some(2000));
    assert_eq!(v.max_lag_bytes, None);
    assert_eq!(
        v.max_lag(),
        (Duration::from_secs(2), DEFAULT_MAX_LAG_BYTES),
        "an unset bound takes its default"
    );
    assert!(v.zone_sync());
    assert_eq!(s.vdis["zs"], v);
}

#[test]
fn test_create_refuses_bad_lag_bounds_and_changes_nothing() {
    let mut s = state();
    let before = s.clone();
    for (ms, bytes) in [
        (Some(0), None),
        (Some(600_001), None),
        (None, Some(4096)),
        (None, Some((16 << 30) + 1)),
        (Some(1000), Some(0)),
    ] {
        let (kind, msg) = s
            .apply(&create("zs", WritePolicy::ZoneSync, ms, bytes), 100)
            .unwrap_err();
        assert_eq!(kind, ErrorKind::Invalid, "{ms:?} {bytes:?}: {msg}");
        assert!(msg.contains("lag bound"), "{msg}");
        assert_eq!(s, before, "a refused create leaves no trace (ids included)");
    }
}

/// A log entry written before policies existed still decodes, as a sync VDI.
#[test]
fn test_old_create_entries_decode_as_sync() {
    let old = r#"{"CreateVdi":{"name":"v","size":1048576,"copies":null,"mode":"Direct",
        "object_size":4194304,"now":1,"home_zone":null,"home_copies":null}}"#;
    let cmd: Command = serde_json::from_str(old).unwrap();
    let Command::CreateVdi {
        policy,
        max_lag_ms,
        max_lag_bytes,
        ..
    } = cmd
    else {
        panic!("decoded as {cmd:?}");
    };
    assert_eq!(
        (policy, max_lag_ms, max_lag_bytes),
        (WritePolicy::Sync, None, None)
    );
}

#[test]
fn test_set_policy_changes_only_what_is_given() {
    let mut s = state();
    let v = vdi(s.apply(&set("base", Some(WritePolicy::ZoneSync), None, None), 1));
    assert_eq!(
        (v.policy, v.max_lag_ms, v.max_lag_bytes),
        (WritePolicy::ZoneSync, None, None)
    );
    let v = vdi(s.apply(&set("base", None, Some(500), None), 1));
    assert_eq!(
        (v.policy, v.max_lag_ms, v.max_lag_bytes),
        (WritePolicy::ZoneSync, Some(500), None)
    );
    let v = vdi(s.apply(&set("base", None, None, Some(64 << 20)), 1));
    assert_eq!(
        (v.policy, v.max_lag_ms, v.max_lag_bytes),
        (WritePolicy::ZoneSync, Some(500), Some(64 << 20))
    );
    let v = vdi(s.apply(&set("base", Some(WritePolicy::Sync), None, None), 1));
    assert_eq!(
        (v.policy, v.max_lag_ms, v.max_lag_bytes),
        (WritePolicy::Sync, Some(500), Some(64 << 20)),
        "back to sync keeps the bounds for the next switch"
    );
    assert_eq!(s.vdis["base"], v);
    // Nothing else of the record moved.
    let before = state().vdis["base"].clone();
    assert_eq!(
        VdiInfo {
            policy: before.policy,
            max_lag_ms: before.max_lag_ms,
            max_lag_bytes: before.max_lag_bytes,
            ..v
        },
        before
    );
}

#[test]
fn test_set_policy_refusals_change_nothing() {
    let mut s = state();
    s.apply(
        &Command::SnapshotVdi {
            name: "base".into(),
            snap: "gold".into(),
            by: NodeId(1),
            now_ms: 200_000,
        },
        200,
    )
    .unwrap();
    let before = s.clone();
    let zs = Some(WritePolicy::ZoneSync);
    let cases = [
        (set("nope", zs, None, None), ErrorKind::NotFound, "No VDI"),
        (set("gold", zs, None, None), ErrorKind::Invalid, "snapshot"),
        (set("base", None, None, None), ErrorKind::Invalid, "Nothing"),
        // A good policy with a bad bound: neither is applied.
        (set("base", zs, Some(0), None), ErrorKind::Invalid, "lag"),
        (
            set("base", zs, Some(1000), Some(1)),
            ErrorKind::Invalid,
            "lag",
        ),
        (
            set("base", zs, Some(u32::MAX), None),
            ErrorKind::Invalid,
            "lag",
        ),
    ];
    for (cmd, kind, words) in cases {
        let (k, msg) = s.apply(&cmd, 300).unwrap_err();
        assert_eq!(k, kind, "{cmd:?}: {msg}");
        assert!(msg.contains(words), "{cmd:?}: {msg}");
        assert_eq!(s, before, "{cmd:?} changed the state");
    }
}

/// A snapshot keeps its VDI's policy and bounds, a clone inherits the snapshot's,
/// and a rollback keeps the VDI's own (its setting, not its past).
#[test]
fn test_snapshots_and_clones_carry_the_policy() {
    let mut s = state();
    s.apply(
        &set("base", Some(WritePolicy::ZoneSync), Some(2000), None),
        1,
    )
    .unwrap();
    s.apply(
        &Command::SnapshotVdi {
            name: "base".into(),
            snap: "gold".into(),
            by: NodeId(1),
            now_ms: 200_000,
        },
        200,
    )
    .unwrap();
    let gold = &s.vdis["gold"];
    assert_eq!(
        (gold.policy, gold.max_lag_ms),
        (WritePolicy::ZoneSync, Some(2000))
    );
    let c = vdi(s.apply(
        &Command::CloneVdi {
            snap: "gold".into(),
            name: "vm1".into(),
            ephemeral: false,
        },
        200,
    ));
    assert_eq!(
        (c.policy, c.max_lag_ms, c.max_lag_bytes),
        (WritePolicy::ZoneSync, Some(2000), None)
    );
    // The clone is its own VDI: changing it leaves the snapshot alone.
    s.apply(&set("vm1", Some(WritePolicy::Sync), None, None), 201)
        .unwrap();
    assert_eq!(s.vdis["gold"].policy, WritePolicy::ZoneSync);
    s.apply(&set("base", None, Some(300), None), 201).unwrap();
    let r = vdi(s.apply(
        &Command::RollbackVdi {
            name: "base".into(),
            snap: "gold".into(),
            now_ms: 300_000,
        },
        300,
    ));
    assert_eq!((r.policy, r.max_lag_ms), (WritePolicy::ZoneSync, Some(300)));
}

fn access(name: &str, clients: &[&str]) -> Command {
    Command::SetVdiAccess {
        name: name.into(),
        nbd_clients: clients.iter().map(|c| c.to_string()).collect(),
    }
}

/// An NBD access list is set whole, cleared with an empty one, carried by
/// snapshots and clones, and a bad list changes nothing.
#[test]
fn test_access_lists_are_set_whole_inherited_and_checked() {
    let mut s = state();
    let v = vdi(s.apply(&access("base", &["vm-host-1", "backup"]), 1));
    assert_eq!(v.nbd_clients, ["vm-host-1", "backup"]);
    assert_eq!(s.vdis["base"].nbd_clients, ["vm-host-1", "backup"]);
    s.apply(
        &Command::SnapshotVdi {
            name: "base".into(),
            snap: "gold".into(),
            by: NodeId(1),
            now_ms: 200_000,
        },
        200,
    )
    .unwrap();
    assert_eq!(s.vdis["gold"].nbd_clients, ["vm-host-1", "backup"]);
    let c = vdi(s.apply(
        &Command::CloneVdi {
            snap: "gold".into(),
            name: "vm1".into(),
            ephemeral: false,
        },
        200,
    ));
    assert_eq!(c.nbd_clients, ["vm-host-1", "backup"]);
    // A snapshot is an export too: its list may change.
    assert_eq!(
        vdi(s.apply(&access("gold", &["restore"]), 201)).nbd_clients,
        ["restore"]
    );
    // Empty: anyone the port lets in; the other records keep theirs.
    assert!(vdi(s.apply(&access("vm1", &[]), 202))
        .nbd_clients
        .is_empty());
    assert_eq!(s.vdis["base"].nbd_clients, ["vm-host-1", "backup"]);

    let before = s.clone();
    let long = "x".repeat(drove_types::MAX_CLIENT_NAME + 1);
    let many: Vec<String> = (0..=drove_types::MAX_NBD_CLIENTS)
        .map(|i| format!("c{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let cases = [
        (access("nope", &["a"]), ErrorKind::NotFound, "No VDI"),
        (access("base", &[""]), ErrorKind::Invalid, "Bad client name"),
        (
            access("base", &[long.as_str()]),
            ErrorKind::Invalid,
            "Bad client name",
        ),
        (
            access("base", &["a\nb"]),
            ErrorKind::Invalid,
            "Bad client name",
        ),
        (access("base", &["a", "a"]), ErrorKind::Invalid, "twice"),
        (access("base", &many), ErrorKind::Invalid, "At most"),
    ];
    for (cmd, kind, words) in cases {
        let (k, msg) = s.apply(&cmd, 300).unwrap_err();
        assert_eq!(k, kind, "{msg}");
        assert!(msg.contains(words), "{msg}");
        assert_eq!(s, before, "a refused access list changed the state");
    }
    // The longest name and the most names pass.
    let most = &many[..drove_types::MAX_NBD_CLIENTS];
    let longest = "y".repeat(drove_types::MAX_CLIENT_NAME);
    assert_eq!(
        vdi(s.apply(&access("base", most), 301)).nbd_clients.len(),
        drove_types::MAX_NBD_CLIENTS
    );
    assert_eq!(
        vdi(s.apply(&access("base", &[longest.as_str()]), 302)).nbd_clients,
        std::slice::from_ref(&longest)
    );
}
