//! The Raft log and vote on disk ([`RaftLogStorage`] over [`Db`]). Raft's safety rests
//! on this file: a vote or an appended entry is acknowledged only after its redb
//! transaction committed (fsync), and writes are serialized because openraft awaits
//! each call before issuing the next.
use crate::db::{keys, Db, DbError, KV, LOGS};
use crate::types::{Entry, LogId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};
use std::fmt::Debug;
use std::ops::RangeBounds;

/// The log store; clones share the database.
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Db,
}

impl LogStore {
    pub(crate) fn new(db: Db) -> Self {
        LogStore { db }
    }
}

fn decode(bytes: &[u8]) -> Result<Entry, serde_json::Error> {
    serde_json::from_slice(bytes)
}

fn read_err(e: DbError) -> StorageError {
    StorageIOError::read_logs(&e).into()
}

fn write_err(e: DbError) -> StorageError {
    StorageIOError::write_logs(&e).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        let raw = self.db.read_logs(bounds).map_err(read_err)?;
        let mut entries = Vec::with_capacity(raw.len());
        for bytes in &raw {
            entries.push(decode(bytes).map_err(|e| StorageIOError::read_logs(&e))?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last = match self.db.last_log().map_err(read_err)? {
            Some(bytes) => Some(
                decode(&bytes)
                    .map_err(|e| StorageIOError::read_logs(&e))?
                    .log_id,
            ),
            None => None,
        };
        let last_purged: Option<LogId> = self.db.get(keys::LAST_PURGED).map_err(read_err)?;
        Ok(LogState {
            last_purged_log_id: last_purged,
            // With every entry purged, the last log id is the last purged one.
            last_log_id: last.or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        self.db
            .put(keys::VOTE, vote)
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        self.db
            .get(keys::VOTE)
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    /// Persisting the committed id lets a restarted node re-apply its committed
    /// entries on top of the last snapshot (the state machine itself is in memory).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.db
            .put(keys::COMMITTED, &committed)
            .await
            .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self
            .db
            .get(keys::COMMITTED)
            .map_err(|e| StorageIOError::read(&e))?;
        Ok(committed.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for entry in entries {
            let bytes = serde_json::to_vec(&entry).map_err(|e| StorageIOError::write_logs(&e))?;
            encoded.push((entry.log_id.index, bytes));
        }
        let res = self
            .db
            .write(move |txn| {
                let mut table = txn.open_table(LOGS)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice())?;
                }
                Ok(())
            })
            .await;
        // The transaction is durable once `write` returns, so the flush callback and
        // the return value report the same outcome.
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(write_err(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "truncating metadata log from here on");
        self.db
            .write(move |txn| {
                txn.open_table(LOGS)?
                    .retain_in(log_id.index.., |_, _| false)?;
                Ok(())
            })
            .await
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "purging metadata log up to here");
        let marker = serde_json::to_vec(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        // The purge marker and the deletion commit together, so a crash never leaves
        // a hole between the marker and the first remaining entry.
        self.db
            .write(move |txn| {
                txn.open_table(KV)?
                    .insert(keys::LAST_PURGED, marker.as_slice())?;
                txn.open_table(LOGS)?
                    .retain_in(..=log_id.index, |_, _| false)?;
                Ok(())
            })
            .await
            .map_err(write_err)
    }
}
