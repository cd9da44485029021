//! A failed disk (docs/self-healing.md, "A failed disk"): the node's object store
//! is a [`GuardedStore`], which refuses everything once a read or write failed with
//! EIO or a flush failed. This module opens it (with the test-only fault hook when
//! `DROVE_DISK_FAULTS` is set) and, once it has failed, marks this node down in the
//! metadata with a reason naming the disk, and again whenever it finds itself up.
//! Its heartbeats say it is unhealthy once it is down (or 2 s after the failure), so
//! the failure detector keeps it down (no flapping) until the process is restarted
//! on a working disk.
use drove_meta::{Command, Meta};
use drove_objstore::{FaultyStore, FileStore, GuardedStore, ObjectStore};
use drove_types::NodeState;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The test-only hook: a control file that makes the store fail
/// ([`drove_objstore::FaultyStore`]); a relative path is taken from the data
/// directory, so one value serves every node `drove up` starts.
pub const FAULTS_ENV: &str = "DROVE_DISK_FAULTS";

/// How often the task looks at the store's latch.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// The node's store at `store_dir` (opened as `file_store`) behind its guard,
/// with the fault hook in between when `faults` (the value of [`FAULTS_ENV`])
/// names a control file.
pub(crate) fn guard(
    file_store: FileStore,
    store_dir: &Path,
    data_dir: &Path,
    faults: Option<std::ffi::OsString>,
) -> Arc<GuardedStore> {
    let mut inner: Arc<dyn ObjectStore> = Arc::new(file_store);
    if let Some(control) = faults.filter(|f| !f.is_empty()) {
        let control = data_dir.join(control);
        tracing::warn!(
            control = %control.display(),
            "{FAULTS_ENV} is set: this node's store fails as that file says (a test hook)"
        );
        inner = Arc::new(FaultyStore::new(inner, control));
    }
    Arc::new(GuardedStore::new(inner, store_dir.display().to_string()))
}

/// The reason this node gives for marking itself down (at most the 1024 bytes
/// the metadata takes).
fn reason(message: &str) -> String {
    let mut r = format!("by the node itself: {message}");
    if r.len() > 1024 {
        let mut end = 1024;
        while !r.is_char_boundary(end) {
            end -= 1;
        }
        r.truncate(end);
    }
    r
}

/// Once `store` has failed, mark this node down (and again whenever the map shows
/// it up). Runs until aborted.
pub async fn mark_down_when_failed(meta: Arc<Meta>, store: Arc<GuardedStore>) {
    let me = meta.node_id();
    let mut told = false;
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let Some(f) = store.failure() else {
            continue;
        };
        let message = f.message();
        if !told {
            told = true;
            tracing::error!(node = %me, "{message}; marking this node down");
        }
        let up = meta
            .state()
            .map
            .node(me)
            .is_some_and(|n| n.state == NodeState::Up);
        if !up {
            continue;
        }
        let cmd = Command::SetNodeState {
            id: me,
            state: NodeState::Down,
            reason: reason(&message),
            hold_ms: 0,
            judged: None,
        };
        if let Err(e) = meta.execute(cmd).await {
            tracing::warn!(node = %me, "cannot mark this node down for its failed disk: {e}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// How long after its disk failed a node still says it is healthy while the map
/// shows it up: its own mark-down, which names the disk, lands first, rather than
/// the failure detector's, which names nothing.
const OWN_MARK_GRACE_MS: u64 = 2000;

/// What this node's heartbeat says (see [`Meta::run_health`]): unhealthy once its
/// disk failed, so that the failure detector keeps it down; but not in the first
/// [`OWN_MARK_GRACE_MS`] while the map still shows it up.
pub fn heartbeat_healthy(meta: &Meta, store: &GuardedStore) -> bool {
    let Some(f) = store.failure() else {
        return true;
    };
    let up = meta
        .state()
        .map
        .node(meta.node_id())
        .is_some_and(|n| n.state == NodeState::Up);
    let now_ms = drove_types::clock::unix_ms();
    healthy_at(Some(f.at_unix_ms), now_ms, up)
}

fn healthy_at(failed_ms: Option<u64>, now_ms: u64, up: bool) -> bool {
    match failed_ms {
        None => true,
        Some(at) => up && now_ms.saturating_sub(at) < OWN_MARK_GRACE_MS,
    }
}

/// This node's failed disk, for `GET /api/local/health`.
pub(crate) fn failure(store: &GuardedStore) -> Option<String> {
    store.failure().map(|f| f.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_failed_disk_makes_heartbeats_unhealthy_once_down_or_after_the_grace() {
        assert!(healthy_at(None, 5_000, true));
        assert!(healthy_at(None, 5_000, false));
        // Just failed, still up: its own mark-down (naming the disk) goes first.
        assert!(healthy_at(Some(5_000), 5_500, true));
        // Down (whoever marked it): kept down.
        assert!(!healthy_at(Some(5_000), 5_500, false));
        // Its own mark-down did not land in time: the detector takes it down.
        assert!(!healthy_at(Some(5_000), 5_000 + OWN_MARK_GRACE_MS, true));
    }

    #[test]
    fn test_the_reason_is_bounded_on_a_char_boundary() {
        assert_eq!(reason("x"), "by the node itself: x");
        let long = "é".repeat(2000);
        let r = reason(&long);
        assert!(r.len() <= 1024 && r.len() > 1000, "{}", r.len());
    }

    #[test]
    fn test_a_relative_control_file_is_taken_from_the_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FileStore::open(&dir.path().join("store"), 4 << 20).unwrap();
        let g = guard(
            fs,
            &dir.path().join("store"),
            dir.path(),
            Some("faults".into()),
        );
        let oid = drove_types::ObjectId::new(drove_types::VdiId(1), 0);
        g.write(oid, 0, &[1u8; 4096]).unwrap();
        std::fs::write(dir.path().join("faults"), "fsync").unwrap();
        // The hook reads the file at most every 100 ms.
        let t = std::time::Instant::now();
        while g.failure().is_none() && t.elapsed() < Duration::from_secs(5) {
            let _ = g.flush(&[]);
            std::thread::sleep(Duration::from_millis(20));
        }
        let f = failure(&g).unwrap();
        assert!(
            f.contains(&format!(
                "The disk at {}",
                dir.path().join("store").display()
            )),
            "{f}"
        );
        assert!(f.contains("fsync failed"), "{f}");
    }
}
