//! Tests of the redb log store and the state machine: openraft's storage conformance
//! suite, then snapshot, restart and deduplication behaviour.
use crate::db::Db;
use crate::log_store::LogStore;
use crate::state::{Command, MetaState, Reply};
use crate::state_machine::StateMachine;
use crate::types::{Entry, Request, RequestId, StorageError, TypeConfig};
use drove_types::{NodeId, NodeInfo, NodeState};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder, StorageIOError};
use std::sync::Arc;
use tempfile::TempDir;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let db = Db::open(&dir.path().join("raft.redb")).map_err(|e| StorageIOError::write(&e))?;
        let (sm, _rx) = StateMachine::open(db.clone()).map_err(|e| StorageIOError::read(&e))?;
        Ok((dir, LogStore::new(db), sm))
    }
}

#[test]
fn test_storage_passes_openraft_suite() {
    Suite::test_all(Builder).unwrap();
}

fn entry(index: u64, id: RequestId, cmd: Command) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request { id, now: 77, cmd }),
    }
}

fn node(id: u64) -> NodeInfo {
    NodeInfo {
        admin_addr: format!("127.0.0.1:{id}"),
        peer_addr: format!("127.0.0.1:{}", id + 100),
        nbd_addr: format!("127.0.0.1:{}", id + 200),
        ..NodeInfo::new(NodeId(id), "z")
    }
}

fn rid(seq: u64) -> RequestId {
    RequestId { client: 9, seq }
}

#[tokio::test]
async fn test_retried_request_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("raft.redb")).unwrap();
    let (mut sm, rx) = StateMachine::open(db).unwrap();
    let out = sm
        .apply([
            entry(1, rid(1), Command::AllocateNodeId),
            // The same request again, as after a leader change: same answer, no effect.
            entry(2, rid(1), Command::AllocateNodeId),
            entry(3, rid(2), Command::AllocateNodeId),
        ])
        .await
        .unwrap();
    assert_eq!(out[0], Ok(Reply::NodeId(NodeId(2))));
    assert_eq!(out[1], Ok(Reply::NodeId(NodeId(2))));
    assert_eq!(out[2], Ok(Reply::NodeId(NodeId(3))));
    assert_eq!(rx.borrow().next_node_id, 4);
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(3));
}

/// A verdict on node 1 made by `judge(term)`, judged in term 1 but committed in
/// term 2, is refused; the same judged and committed in term 1 is applied.
async fn check_a_verdict_committed_in_another_term_is_refused(judge: impl Fn(u64) -> Command) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("raft.redb")).unwrap();
    let (mut sm, rx) = StateMachine::open(db).unwrap();
    let mut late = entry(3, rid(3), judge(1));
    late.log_id = LogId::new(CommittedLeaderId::new(2, 1), 3);
    let out = sm
        .apply([
            entry(1, rid(1), Command::UpsertNode(node(1))),
            // Judged by the leader of term 1 and committed in term 2 (the old leader
            // was cut off; its write was forwarded to the new one after the heal).
            late,
            // The leader of term 1 judging in term 1.
            entry(4, rid(4), judge(1)),
        ])
        .await
        .unwrap();
    assert!(out[0].is_ok());
    let refused = out[1].clone().unwrap_err();
    assert!(refused.1.contains("term 1"), "{refused:?}");
    assert_eq!(out[2], Ok(Reply::Done));
    let state = rx.borrow().clone();
    assert_eq!(state.map.node(NodeId(1)).unwrap().state, NodeState::Down);
    // One epoch for the join, one for the verdict of term 1; none for the late one.
    assert_eq!(state.epoch_history.len(), 2);
}

#[tokio::test]
async fn test_a_verdict_committed_in_another_term_is_refused() {
    check_a_verdict_committed_in_another_term_is_refused(|term| Command::JudgeNodeState {
        id: NodeId(1),
        state: NodeState::Down,
        term,
    })
    .await;
}

#[tokio::test]
async fn test_a_batch_of_verdicts_committed_in_another_term_is_refused() {
    check_a_verdict_committed_in_another_term_is_refused(|term| Command::JudgeNodes {
        verdicts: vec![(NodeId(1), NodeState::Down)],
        term,
    })
    .await;
}

#[tokio::test]
async fn test_snapshot_installs_elsewhere_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("a.redb")).unwrap();
    let (mut sm, _rx) = StateMachine::open(db).unwrap();
    sm.apply([
        entry(1, rid(1), Command::UpsertNode(node(1))),
        entry(2, rid(2), Command::SetDefaultCopies(1)),
    ])
    .await
    .unwrap();
    let mut builder = sm.get_snapshot_builder().await;
    let snap = builder.build_snapshot().await.unwrap();
    assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(2));

    // Install on a second, empty state machine, then reopen its file.
    let path = dir.path().join("b.redb");
    let expected: MetaState;
    {
        let db = Db::open(&path).unwrap();
        let (mut other, rx) = StateMachine::open(db).unwrap();
        other
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        expected = (**rx.borrow()).clone();
        assert_eq!(expected.settings.default_copies, 1);
        assert!(expected.map.nodes.contains_key(&NodeId(1)));
        // A request id from before the snapshot is still recognised: sent with
        // another command, it is refused, not applied.
        let out = other
            .apply([entry(3, rid(2), Command::SetDefaultCopies(4))])
            .await
            .unwrap();
        assert!(out[0].is_err(), "{:?}", out[0]);
        assert_eq!(rx.borrow().settings.default_copies, 1);
    }
    let db = Db::open(&path).unwrap();
    let (mut reopened, rx) = StateMachine::open(db).unwrap();
    assert_eq!(*rx.borrow(), Arc::new(expected));
    let (applied, _) = reopened.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(2));
    let current = reopened.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snap.meta);
}

#[tokio::test]
async fn test_log_and_vote_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    let vote = openraft::Vote::new(3, 2);
    {
        let mut log = LogStore::new(Db::open(&path).unwrap());
        log.save_vote(&vote).await.unwrap();
        let entries = vec![
            entry(1, rid(1), Command::AllocateNodeId),
            entry(2, rid(2), Command::AllocateNodeId),
        ];
        openraft::storage::RaftLogStorageExt::blocking_append(&mut log, entries)
            .await
            .unwrap();
        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 1))
            .await
            .unwrap();
    }
    let mut log = LogStore::new(Db::open(&path).unwrap());
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(1));
    assert_eq!(state.last_log_id.map(|l| l.index), Some(2));
}

#[tokio::test]
async fn test_a_batch_applies_each_command_on_its_own_and_refuses_nesting_and_excess() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("raft.redb")).unwrap();
    let (mut sm, rx) = StateMachine::open(db).unwrap();
    let req = |seq, cmd| Request {
        id: rid(seq),
        now: 77,
        cmd,
    };
    let judge_unknown = Command::JudgeNodeState {
        id: NodeId(42),
        state: NodeState::Down,
        term: 1,
    };
    let batch = Command::Batch(vec![
        req(1, Command::AllocateNodeId),
        // Refused on its own (no such node); the others still apply.
        req(2, judge_unknown),
        req(3, Command::AllocateNodeId),
        req(4, Command::Batch(vec![req(5, Command::AllocateNodeId)])),
    ]);
    let too_long = Command::Batch(
        (0..=crate::batch::MAX_BATCH as u64)
            .map(|i| req(100 + i, Command::AllocateNodeId))
            .collect(),
    );
    let out = sm
        .apply([
            entry(1, rid(50), batch),
            entry(2, rid(51), too_long),
            // A command of the batch retried on its own: the batch's answer, no effect.
            entry(3, rid(3), Command::AllocateNodeId),
        ])
        .await
        .unwrap();
    let Ok(Reply::Batch(each)) = &out[0] else {
        panic!("{:?}", out[0]);
    };
    assert_eq!(each.len(), 4);
    assert_eq!(each[0], Ok(Reply::NodeId(NodeId(2))));
    assert!(each[1].is_err(), "{:?}", each[1]);
    assert_eq!(each[2], Ok(Reply::NodeId(NodeId(3))));
    assert!(each[3]
        .clone()
        .unwrap_err()
        .1
        .contains("may not hold a batch"));
    assert!(
        out[1].clone().unwrap_err().1.contains("at most"),
        "{:?}",
        out[1]
    );
    assert_eq!(out[2], Ok(Reply::NodeId(NodeId(3))));
    assert_eq!(
        rx.borrow().next_node_id,
        4,
        "nothing of the refused batches applied"
    );
}

fn create_vdi(name: &str, now: u64) -> Command {
    Command::CreateVdi {
        name: name.to_string(),
        size: 1 << 20,
        copies: Some(1),
        mode: drove_types::ReplicationMode::Direct,
        object_size: drove_types::DEFAULT_OBJECT_SIZE,
        now,
        home_zone: None,
        home_copies: None,
        policy: Default::default(),
        max_lag_ms: None,
        max_lag_bytes: None,
        qos: Default::default(),
    }
}

/// A request id sent again with another command (a user reusing `--request-id`) is
/// refused, not answered with the first command's result; the same command sent
/// again (a retry, its proposer's clock later) still gets the first result. The
/// comparison survives a snapshot.
#[tokio::test]
async fn test_a_request_id_reused_for_another_command_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("a.redb")).unwrap();
    let (mut sm, rx) = StateMachine::open(db).unwrap();
    let delete = |name: &str| Command::DeleteVdi {
        name: name.to_string(),
        force: false,
    };
    let out = sm
        .apply([
            entry(1, rid(1), Command::UpsertNode(node(1))),
            entry(2, rid(2), create_vdi("pat", 10)),
            entry(3, rid(3), create_vdi("rq1", 10)),
            entry(4, rid(3), create_vdi("rq2", 11)),
            entry(5, rid(3), delete("pat")),
            // The first command again, proposed a second later: a retry.
            entry(6, rid(3), create_vdi("rq1", 11)),
        ])
        .await
        .unwrap();
    let Ok(Reply::Vdi(rq1)) = &out[2] else {
        panic!("{:?}", out[2]);
    };
    assert_eq!(rq1.name, "rq1");
    for refused in [&out[3], &out[4]] {
        let (kind, msg) = refused.clone().unwrap_err();
        assert_eq!(kind, drove_types::ErrorKind::Invalid, "{msg}");
        assert!(msg.contains("request id"), "{msg}");
    }
    assert_eq!(out[5], out[2]);
    let names: Vec<String> = rx.borrow().vdis.keys().cloned().collect();
    assert_eq!(names, ["pat", "rq1"]);

    // The same after a snapshot is installed elsewhere.
    let snap = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let db = Db::open(&dir.path().join("b.redb")).unwrap();
    let (mut other, rx) = StateMachine::open(db).unwrap();
    other
        .install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    let out = other
        .apply([
            entry(7, rid(3), delete("pat")),
            entry(8, rid(3), create_vdi("rq1", 12)),
        ])
        .await
        .unwrap();
    assert!(
        out[0].clone().unwrap_err().1.contains("request id"),
        "{:?}",
        out[0]
    );
    assert_eq!(out[1], Ok(Reply::Vdi(rq1.clone())));
    assert!(rx.borrow().vdis.contains_key("pat"));
}
