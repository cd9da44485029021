//! `Command` is the Raft log's on-disk format (serde JSON in every entry) and
//! `Reply` travels in Raft responses: a sample of every variant, serialized, must
//! read byte for byte as it did when the state machine was split into per-area
//! handlers (the strings below were printed by the code before the split), and
//! read back as the same value.
use super::lease::LeaseExtension;
use super::{ApiToken, Command, Reply, Role, VdiLock};
use crate::types::{Request, RequestId};
use drove_types::{
    Epoch, ErrorKind, NodeId, NodeInfo, NodeState, ReplicationMode, VdiId, VdiInfo, WritePolicy,
};

fn samples() -> Vec<Command> {
    let node = NodeInfo {
        admin_addr: "127.0.0.1:1".into(),
        peer_addr: "127.0.0.1:2".into(),
        nbd_addr: "127.0.0.1:3".into(),
        // As the release before feature levels wrote it.
        features: 0,
        version: String::new(),
        ..NodeInfo::new(NodeId(4), "z1")
    };
    let inner = Request {
        id: RequestId { client: 7, seq: 8 },
        now: 9,
        cmd: Command::SetNoout(true),
    };
    vec![
        Command::Batch(vec![inner]),
        Command::AllocateNodeId,
        Command::UpsertNode(node),
        Command::SetNodeState {
            id: NodeId(2),
            state: NodeState::Down,
            reason: "silent".into(),
            hold_ms: 60_000,
            judged: None,
        },
        Command::RemoveNode { id: NodeId(3) },
        Command::JudgeNodeState {
            id: NodeId(2),
            state: NodeState::Up,
            term: 5,
        },
        Command::JudgeNodes {
            verdicts: vec![(NodeId(2), NodeState::Down), (NodeId(3), NodeState::Up)],
            term: 6,
        },
        Command::CreateVdi {
            name: "disk".into(),
            size: 1 << 30,
            copies: Some(3),
            mode: ReplicationMode::default(),
            object_size: 4 << 20,
            now: 1_700_000_000,
            home_zone: Some("z1".into()),
            home_copies: Some(2),
            policy: WritePolicy::default(),
            max_lag_ms: Some(500),
            max_lag_bytes: Some(1 << 20),
            qos: Default::default(),
        },
        Command::DeleteVdi {
            name: "disk".into(),
            force: true,
        },
        Command::ResizeVdi {
            name: "disk".into(),
            size: 2 << 30,
        },
        Command::SetDefaultCopies(2),
        Command::SetHealthSettings {
            down_after_ms: Some(5000),
            recovery_mib_s: None,
            hold_down_ms: Some(1000),
        },
        Command::SetMinCopies {
            name: "disk".into(),
            min_copies: Some(1),
        },
        Command::SetVdiPolicy {
            name: "disk".into(),
            policy: Some(WritePolicy::default()),
            max_lag_ms: None,
            max_lag_bytes: Some(4096),
            reset_max_lag_ms: true,
            reset_max_lag_bytes: false,
        },
        Command::AcquireLock {
            vdi: "disk".into(),
            node: NodeId(2),
            now_ms: 1_700_000_000_000,
            lease_ms: 10_000,
            incarnation: 77,
        },
        Command::ExtendLeases {
            leases: vec![LeaseExtension {
                vdi: VdiId(1),
                owner: NodeId(2),
                incarnation: 77,
                generation: 3,
                until_ms: 1_700_000_010_000,
            }],
        },
        Command::MarkSettled {
            vdi: VdiId(1),
            node: NodeId(2),
            generation: 3,
        },
        Command::ReleaseLock {
            vdi: "disk".into(),
            node: NodeId(2),
            generation: 3,
        },
        Command::RequestHandover {
            vdi: "disk".into(),
            to: NodeId(3),
        },
        Command::SnapshotVdi {
            name: "disk".into(),
            snap: "s1".into(),
            by: NodeId(2),
            now_ms: 1_700_000_000_000,
        },
        Command::CloneVdi {
            snap: "s1".into(),
            name: "c1".into(),
            ephemeral: true,
        },
        Command::CloneMany {
            snap: "s1".into(),
            names: vec!["c2".into(), "c3".into()],
            ephemeral: false,
        },
        Command::RollbackVdi {
            name: "disk".into(),
            snap: "s1".into(),
            now_ms: 1_700_000_000_000,
        },
        Command::Flattened {
            name: "c1".into(),
            id: VdiId(4),
        },
        Command::DeleteEphemeral {
            name: "c1".into(),
            id: VdiId(4),
        },
        Command::PromoteVdi {
            name: "disk".into(),
            zone: "z2".into(),
        },
        Command::GrowVdi {
            name: "disk".into(),
            by: 4096,
        },
        Command::RenameVdi {
            name: "disk".into(),
            to: "disk2".into(),
        },
        Command::BreakLock { vdi: "disk".into() },
        Command::SetNoout(false),
        Command::SetBackfillFull(90),
        Command::AddToken {
            name: "ops".into(),
            role: Role::Operator,
            sha256: "ab".repeat(32),
        },
        Command::RemoveToken { name: "ops".into() },
        Command::SetVdiAccess {
            name: "disk".into(),
            nbd_clients: vec!["vm1".into()],
        },
        Command::TrimHistory {
            keep_from: Epoch(12),
        },
        Command::ForgetRun {
            node: NodeId(2),
            incarnation: 78,
        },
    ]
}

const EXPECTED: &str = include_str!("command_golden.txt");

fn printed() -> String {
    let mut out = String::new();
    for cmd in samples() {
        let json = serde_json::to_string(&cmd).unwrap_or_default();
        out.push_str(&format!("{}\t{json}\n", cmd.kind()));
    }
    let lock = VdiLock {
        owner: NodeId(2),
        generation: 3,
        expires_ms: 4,
        handover_to: Some(NodeId(3)),
        vdi: VdiId(1),
        incarnation: 77,
        home_zone: Some("z1".into()),
        lease_ms: 10_000,
    };
    let vdi = VdiInfo::new(VdiId(1), "disk", 1 << 30, 4 << 20, 3);
    let replies: Vec<Result<Reply, (ErrorKind, String)>> = vec![
        Ok(Reply::Done),
        Ok(Reply::NodeId(NodeId(5))),
        Ok(Reply::Vdi(vdi)),
        Ok(Reply::Kept(vec!["c1".into()])),
        Ok(Reply::Lock(lock)),
        Ok(Reply::Batch(vec![
            Ok(Reply::Done),
            Err((ErrorKind::Locked, "in use".into())),
        ])),
    ];
    for r in replies {
        out.push_str(&format!(
            "reply\t{}\n",
            serde_json::to_string(&r).unwrap_or_default()
        ));
    }
    let token = ApiToken {
        role: Role::Admin,
        sha256: "cd".repeat(32),
        created_ms: 5,
    };
    out.push_str(&format!(
        "token\t{}\n",
        serde_json::to_string(&token).unwrap_or_default()
    ));
    out
}

#[test]
fn test_every_command_serializes_as_before_the_split() {
    let kinds: std::collections::BTreeSet<&str> = samples().iter().map(|c| c.kind()).collect();
    assert_eq!(kinds.len(), 36, "one sample per Command variant");
    let got = printed();
    // DROVE_WRITE_GOLDEN=path writes what the code prints now (to make the file
    // again after a deliberate change of the format, which old logs must still read).
    if let Some(path) = std::env::var_os("DROVE_WRITE_GOLDEN") {
        std::fs::write(path, &got).unwrap_or_default();
    }
    assert_eq!(got, EXPECTED);
}

#[test]
fn test_every_command_reads_back_as_itself() {
    for cmd in samples() {
        let json = serde_json::to_vec(&cmd).unwrap_or_default();
        let back: Command = serde_json::from_slice(&json).unwrap_or(Command::AllocateNodeId);
        assert_eq!(back, cmd);
    }
}

/// `SetNodeState`'s `judged` (feature level 3) is left out when absent, so the
/// entries of every older build read as before; present, it reads back.
#[test]
fn test_a_verdicts_judge_is_optional_on_disk() {
    let old = r#"{"SetNodeState":{"id":2,"state":"down","reason":"silent","hold_ms":60000}}"#;
    let cmd: Command = serde_json::from_str(old).unwrap();
    assert!(matches!(cmd, Command::SetNodeState { judged: None, .. }));
    assert_eq!(serde_json::to_string(&cmd).unwrap(), old);
    let judged = Command::SetNodeState {
        id: NodeId(2),
        state: NodeState::Down,
        reason: String::new(),
        hold_ms: 0,
        judged: Some(super::Judged {
            by: NodeId(1),
            seen: Epoch(9),
        }),
    };
    let json = serde_json::to_string(&judged).unwrap();
    assert!(json.contains(r#""judged":{"by":1,"seen":9}"#), "{json}");
    assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), judged);
}
