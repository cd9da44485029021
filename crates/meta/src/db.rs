//! The metadata's local disk: one redb file, `data_dir/meta/raft.redb`, holding the
//! Raft log, the vote, the committed and purged log ids, the last snapshot and this
//! node's id. Every write is one redb transaction committed with immediate
//! durability (fsync before `commit` returns), which is what Raft needs for votes and
//! log entries. Writes run on the blocking pool so an fsync never stalls a runtime
//! worker; reads are served from redb's cache inline. In the simulator the file is
//! a [`crate::MemDisk`] on the simulated node's disk, and writes run on the calling
//! task (no thread to wait for: the order of events stays the seed's).
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

/// A metadata disk write slower than this is logged.
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_millis(500);

/// Log entries by index, JSON encoded.
pub(crate) const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");
/// Small named values, JSON encoded (see [`keys`]).
pub(crate) const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");

/// Keys of [`KV`].
pub(crate) mod keys {
    /// The last vote (term and candidate) this node granted or cast.
    pub const VOTE: &str = "vote";
    /// The last log id known committed.
    pub const COMMITTED: &str = "committed";
    /// The last log id removed by log compaction.
    pub const LAST_PURGED: &str = "last_purged";
    /// Metadata of the current snapshot.
    pub const SNAPSHOT_META: &str = "snapshot_meta";
    /// Data of the current snapshot.
    pub const SNAPSHOT_DATA: &str = "snapshot_data";
    /// This node's Raft id, fixed at first start.
    pub const NODE_ID: &str = "node_id";
    /// The cluster this node belongs to, fixed at first start (stored before the
    /// node id, so a directory with a node id always has it).
    pub const CLUSTER_ID: &str = "cluster_id";
}

/// Why a local metadata read or write failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    /// redb refused.
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    /// A stored value did not decode, or a value did not encode.
    #[error("encoding: {0}")]
    Codec(#[from] serde_json::Error),
    /// The blocking task that ran the write died.
    #[error("blocking write task failed: {0}")]
    Join(String),
}

impl DbError {
    /// True when another handle (maybe a previous instance still winding down in
    /// this process) holds the file lock.
    pub(crate) fn is_already_open(&self) -> bool {
        matches!(self, DbError::Redb(redb::Error::DatabaseAlreadyOpen))
    }
}

/// A cheap clonable handle on the database.
#[derive(Clone)]
pub(crate) struct Db {
    db: Arc<Database>,
    /// Writes run on the calling task (a disk in memory, which never blocks).
    inline: bool,
}

impl Db {
    /// Open or create the file (mode 0600: redb's own `create` would take the
    /// umask's mode) and make sure both tables exist (redb refuses to open a missing
    /// table in a read transaction).
    pub(crate) fn open(path: &Path) -> Result<Db, DbError> {
        let file = drove_types::private_fs::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(redb::Error::from)?;
        let db = Database::builder()
            .create_file(file)
            .map_err(redb::Error::from)?;
        Db::with_tables(db, false)
    }

    /// Open or create the database on `disk`, in memory.
    pub(crate) fn open_mem(disk: crate::MemDisk) -> Result<Db, DbError> {
        let db = Database::builder()
            .create_with_backend(disk)
            .map_err(redb::Error::from)?;
        Db::with_tables(db, true)
    }

    fn with_tables(db: Database, inline: bool) -> Result<Db, DbError> {
        let txn = db.begin_write().map_err(redb::Error::from)?;
        txn.open_table(LOGS).map_err(redb::Error::from)?;
        txn.open_table(KV).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        Ok(Db {
            db: Arc::new(db),
            inline,
        })
    }

    /// Run `f` in one write transaction on the blocking pool and commit durably.
    pub(crate) async fn write<F>(&self, f: F) -> Result<(), DbError>
    where
        F: FnOnce(&WriteTransaction) -> Result<(), redb::Error> + Send + 'static,
    {
        let db = self.db.clone();
        if self.inline {
            let txn = db.begin_write().map_err(redb::Error::from)?;
            f(&txn)?;
            txn.commit().map_err(redb::Error::from)?;
            return Ok(());
        }
        tokio::task::spawn_blocking(move || -> Result<(), DbError> {
            let began = std::time::Instant::now();
            let txn = db.begin_write().map_err(redb::Error::from)?;
            f(&txn)?;
            // Default durability is Immediate: commit returns after fsync.
            txn.commit().map_err(redb::Error::from)?;
            let took = began.elapsed();
            if took >= SLOW_WRITE {
                // Every Raft step waits for these: say when the disk makes them slow.
                tracing::warn!(
                    "metadata disk write took {took:.1?} (fsync behind other writes on this disk?)"
                );
            }
            Ok(())
        })
        .await
        .map_err(|e| DbError::Join(e.to_string()))?
    }

    /// Store `value` under `key` durably.
    pub(crate) async fn put<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
    ) -> Result<(), DbError> {
        let bytes = serde_json::to_vec(value)?;
        self.write(move |txn| {
            txn.open_table(KV)?.insert(key, bytes.as_slice())?;
            Ok(())
        })
        .await
    }

    /// The raw bytes under `key`.
    pub(crate) fn get_raw(&self, key: &str) -> Result<Option<Vec<u8>>, DbError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let table = txn.open_table(KV).map_err(redb::Error::from)?;
        let value = table.get(key).map_err(redb::Error::from)?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    /// The value under `key`, decoded.
    pub(crate) fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, DbError> {
        match self.get_raw(key)? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The encoded log entries whose index is in `range`, in index order.
    pub(crate) fn read_logs(
        &self,
        range: (Bound<u64>, Bound<u64>),
    ) -> Result<Vec<Vec<u8>>, DbError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let table = txn.open_table(LOGS).map_err(redb::Error::from)?;
        let mut out = Vec::new();
        for item in table.range::<u64>(range).map_err(redb::Error::from)? {
            let (_, v) = item.map_err(redb::Error::from)?;
            out.push(v.value().to_vec());
        }
        Ok(out)
    }

    /// The encoded last log entry, if the log is not empty.
    pub(crate) fn last_log(&self) -> Result<Option<Vec<u8>>, DbError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let table = txn.open_table(LOGS).map_err(redb::Error::from)?;
        let last = table.last().map_err(redb::Error::from)?;
        Ok(last.map(|(_, v)| v.value().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn test_the_database_file_is_its_users_only_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        let db = Db::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600, "raft.redb is {mode:o}");
        let txn = db.db.begin_write().unwrap();
        txn.open_table(KV).unwrap().insert("k", &b"v"[..]).unwrap();
        txn.commit().unwrap();
        drop(db);
        // An existing database opens with its content.
        let db = Db::open(&path).unwrap();
        let txn = db.db.begin_read().unwrap();
        let v = txn.open_table(KV).unwrap().get("k").unwrap().unwrap();
        assert_eq!(v.value(), b"v");
    }
}
