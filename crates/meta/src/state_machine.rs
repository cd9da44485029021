//! The Raft state machine around [`MetaState`] ([`RaftStateMachine`]): applies
//! committed entries in memory, publishes each new state on a watch channel, and
//! builds, installs and persists snapshots (the whole state as JSON; metadata is
//! small). The state itself is not written on apply: after a restart it is rebuilt
//! from the persisted snapshot plus the committed log, which openraft re-applies.
//!
//! It also remembers the results of the last [`RECENT`] requests by [`RequestId`], so
//! a write retried after an ambiguous failure returns the first result instead of
//! applying twice; the same id sent with another command is refused (see
//! [`crate::dedup`]). That window is part of the snapshot to stay deterministic.
use crate::db::{keys, Db, DbError, KV};
use crate::dedup::Remembered;
use crate::state::{invalid, ApplyResult, Command, MetaState, Reply};
use crate::types::{
    Entry, LogId, RequestId, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Cursor;
use std::sync::Arc;
use tokio::sync::watch;

/// How many recent request results are kept for deduplication.
pub(crate) const RECENT: usize = 1024;

/// What a snapshot carries.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SnapshotBody {
    state: MetaState,
    recent: VecDeque<Remembered>,
}

/// The state machine. The state is behind an `Arc` so readers get it without a lock
/// and apply copies it at most once per batch (copy-on-write).
pub(crate) struct StateMachine {
    db: Db,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: Arc<MetaState>,
    recent: VecDeque<Remembered>,
    tx: watch::Sender<Arc<MetaState>>,
}

fn snapshot_read_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    StorageIOError::read_snapshot(None, e).into()
}

impl StateMachine {
    /// Load the persisted snapshot, if any. Entries after it are re-applied by
    /// openraft at start.
    pub(crate) fn open(db: Db) -> Result<(StateMachine, watch::Receiver<Arc<MetaState>>), DbError> {
        let (meta, body) = match load_snapshot(&db)? {
            Some((meta, data)) => (Some(meta), serde_json::from_slice::<SnapshotBody>(&data)?),
            None => (None, SnapshotBody::default()),
        };
        let state = Arc::new(body.state);
        let (tx, rx) = watch::channel(state.clone());
        let sm = StateMachine {
            db,
            last_applied: meta.as_ref().and_then(|m| m.last_log_id),
            membership: meta.map(|m| m.last_membership).unwrap_or_default(),
            state,
            recent: body.recent,
            tx,
        };
        Ok((sm, rx))
    }

    /// Apply a command that was committed in Raft term `term`.
    fn apply_normal(
        &mut self,
        id: RequestId,
        now: u64,
        term: u64,
        cmd: &crate::state::Command,
    ) -> ApplyResult {
        let digest = crate::dedup::digest(cmd);
        if let Some(r) = self.recent.iter().find(|r| r.id == id) {
            return r.answer(digest);
        }
        let judged = match cmd {
            crate::state::Command::JudgeNodeState {
                id, term: judged, ..
            } => Some((format!("on node {id}"), *judged)),
            crate::state::Command::JudgeNodes {
                verdicts,
                term: judged,
            } => Some((format!("on {} nodes", verdicts.len()), *judged)),
            _ => None,
        };
        if let Some((what, judged)) = judged {
            if judged != term {
                return Err((
                    drove_types::ErrorKind::Invalid,
                    format!(
                        "The verdict {what} was judged by the leader of term \
                         {judged}; the leader is now of term {term}"
                    ),
                ));
            }
        }
        let res = Arc::make_mut(&mut self.state).apply(cmd, now);
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(Remembered {
            id,
            result: res.clone(),
            digest: Some(digest),
        });
        res
    }

    fn body_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&SnapshotBodyRef {
            state: &self.state,
            recent: &self.recent,
        })
    }
}

/// Borrowing twin of [`SnapshotBody`] so building a snapshot does not clone the state.
#[derive(Serialize)]
struct SnapshotBodyRef<'a> {
    state: &'a MetaState,
    recent: &'a VecDeque<Remembered>,
}

fn load_snapshot(db: &Db) -> Result<Option<(SnapshotMeta, Vec<u8>)>, DbError> {
    let meta: Option<SnapshotMeta> = db.get(keys::SNAPSHOT_META)?;
    let data = db.get_raw(keys::SNAPSHOT_DATA)?;
    Ok(meta.zip(data))
}

/// Persist a snapshot: metadata and data in one transaction, replacing the old one.
async fn save_snapshot(db: &Db, meta: &SnapshotMeta, data: Vec<u8>) -> Result<(), StorageError> {
    let meta_bytes = serde_json::to_vec(meta)
        .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
    db.write(move |txn| {
        let mut kv = txn.open_table(KV)?;
        kv.insert(keys::SNAPSHOT_META, meta_bytes.as_slice())?;
        kv.insert(keys::SNAPSHOT_DATA, data.as_slice())?;
        Ok(())
    })
    .await
    .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e).into())
}

/// A frozen copy of the state machine taken when openraft asks for a snapshot.
pub(crate) struct Builder {
    db: Db,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    data: Result<Vec<u8>, String>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let data = self
            .data
            .clone()
            .map_err(|e| StorageIOError::read_state_machine(&std::io::Error::other(e)))?;
        let millis = drove_types::clock::unix_ms();
        let snapshot_id = match self.last_applied {
            Some(l) => format!("{}-{}-{millis}", l.leader_id, l.index),
            None => format!("--{millis}"),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        save_snapshot(&self.db, &meta, data.clone()).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let mut changed = false;
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => out.push(Ok(Reply::Done)),
                EntryPayload::Normal(req) => {
                    let term = entry.log_id.leader_id.term;
                    if term > self.state.lease_term {
                        Arc::make_mut(&mut self.state).new_term(term, req.now.saturating_mul(1000));
                    }
                    let res = match &req.cmd {
                        Command::Batch(reqs) if reqs.len() > crate::batch::MAX_BATCH => {
                            Err(invalid(format!(
                                "A batch of {} commands (at most {})",
                                reqs.len(),
                                crate::batch::MAX_BATCH
                            )))
                        }
                        Command::Batch(reqs) => Ok(Reply::Batch(
                            reqs.iter()
                                .map(|r| self.apply_normal(r.id, r.now, term, &r.cmd))
                                .collect(),
                        )),
                        cmd => self.apply_normal(req.id, req.now, term, cmd),
                    };
                    out.push(res);
                    changed = true;
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    out.push(Ok(Reply::Done));
                }
            }
        }
        if changed {
            self.tx.send_replace(self.state.clone());
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Builder {
            db: self.db.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            data: self.body_bytes().map_err(|e| e.to_string()),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let body: SnapshotBody = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        // Persist first: if we crash after this, restart loads the new snapshot.
        save_snapshot(&self.db, meta, data).await?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.state = Arc::new(body.state);
        self.recent = body.recent;
        self.tx.send_replace(self.state.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let loaded = load_snapshot(&self.db).map_err(|e| snapshot_read_err(&e))?;
        Ok(loaded.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
