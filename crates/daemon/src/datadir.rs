//! The data directory belongs to one node process at a time. A second `drove node
//! run` on the same directory once started silently, replaced the first one's
//! `nbd.sock`, and from then on every attach through that node failed while the map
//! showed it up. Now a node holds an exclusive `flock` on `DIR/node.lock` for as long
//! as it runs (the kernel drops it when the process dies, even by SIGKILL, so a
//! crashed node never leaves a stale lock), and a second one refuses to start,
//! naming the pid recorded in the file.
use drove_types::{Error, ErrorKind, Result};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Take the lock of data directory `dir` (created if missing) for this process.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("Cannot create {}", dir.display()), e))?;
        let path = dir.join("node.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(format!("Cannot open {}", path.display()), e))?;
        // An exclusive flock, not waited for.
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                let who = if pid.is_empty() {
                    "another process".to_string()
                } else {
                    format!("another drove node (pid {pid})")
                };
                return Err(Error::new(
                    ErrorKind::Locked,
                    format!(
                        "Data directory {} is in use by {who}; stop it first, or give this node its own --data",
                        dir.display()
                    ),
                ));
            }
            Err(std::fs::TryLockError::Error(err)) => {
                return Err(Error::io(format!("Cannot lock {}", path.display()), err));
            }
        }
        // Ours now: record who holds it, for the message above.
        let record = file
            .set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| writeln!(file, "{}", std::process::id()));
        if let Err(e) = record {
            tracing::warn!("cannot record the pid in {}: {e}", path.display());
        }
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        // flock locks belong to the open file description: a second open in this
        // same process conflicts like another process would.
        let err = DirLock::acquire(dir.path()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Locked);
        let pid = std::process::id().to_string();
        assert!(err.to_string().contains(&format!("pid {pid}")), "{err}");
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
