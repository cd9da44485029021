//! The data directory: one node process at a time, and no one else's to read.
//!
//! A second `drove node run` on the same directory once started silently, replaced
//! the first one's `nbd.sock`, and from then on every attach through that node
//! failed while the map showed it up. Now a node holds an exclusive `flock` on
//! `DIR/node.lock` for as long as it runs (the kernel drops it when the process
//! dies, even by SIGKILL, so a crashed node never leaves a stale lock), and a
//! second one refuses to start, naming the pid recorded in the file.
//!
//! The directory holds every VDI's data in clear, the metadata and often the
//! node's TLS key. Everything a node creates in it is its user's only (mode 0600,
//! directories 0700: `drove_types::private_fs`), whatever the umask; the directory
//! itself is 0710, its group the NBD socket's, so that the group may reach
//! `nbd.sock` (0660) and nothing else. A directory an older drove made under a
//! looser umask (objects 0644 in 0755 directories) is tightened at start: the
//! directory is closed (0700) first, then every entry in it loses its group and
//! other bits. That is enough for what lies deeper (`store/`, `meta/`): a file is
//! out of reach when a directory on its path is, and walking every object at each
//! start would cost one system call per file.
use drove_types::{private_fs, Error, ErrorKind, Result};
use std::fs::{File, Permissions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The data directory's mode while the node runs: its group may reach the
/// socket in it (search), not list it.
pub const DIR_OPEN_MODE: u32 = 0o710;

/// A data directory held by this process; dropping it (or the process ending)
/// releases the lock.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Take data directory `dir` for this process: create it if missing, lock it,
    /// then close it to everyone but its user (0700) and take the group and other
    /// bits off what is in it. [`DataDir::open_to`] lets the socket's group in
    /// once the socket has its own mode.
    pub fn acquire(dir: &Path) -> Result<DataDir> {
        create(dir)?;
        let lock = lock(dir)?;
        set_mode(dir, private_fs::DIR_MODE)?;
        tighten_entries(dir)?;
        Ok(DataDir {
            path: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// Let group `gid` search the directory (mode 0710, group `gid`): call once
    /// every entry it could reach (the socket) has its mode.
    pub fn open_to(&self, gid: u32) -> Result<()> {
        std::os::unix::fs::chown(&self.path, None, Some(gid)).map_err(|e| {
            Error::io(
                format!(
                    "Cannot give the data directory {} to group {gid} (the node's user must \
                     own it and be a member of the group)",
                    self.path.display()
                ),
                e,
            )
        })?;
        set_mode(&self.path, DIR_OPEN_MODE)
    }
}

/// Create `dir` (0700) if it is missing; its missing parents are made as any
/// `mkdir -p` would (they are not the node's).
fn create(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("Cannot create {}", parent.display()), e))?;
    }
    match private_fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(Error::io(format!("Cannot create {}", dir.display()), e))
        }
        _ => Ok(()),
    }
}

/// The exclusive lock on `dir/node.lock`, or why not.
fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("node.lock");
    let mut file = private_fs::options()
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
    Ok(file)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, Permissions::from_mode(mode)).map_err(|e| {
        Error::io(
            format!(
                "Cannot set the mode of {} to {mode:o} (the data directory must belong to \
                 the node's user)",
                path.display()
            ),
            e,
        )
    })
}

/// Take the group and other bits off every entry of `dir` that has any. Symbolic
/// links are left alone (chmod would change what they point to). `dir` is closed
/// already, so no one else can swap an entry between the look and the chmod.
fn tighten_entries(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("Cannot list {}", dir.display()), e))?;
    let mut tightened = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("Cannot list {}", dir.display()), e))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| Error::io(format!("Cannot stat {}", path.display()), e))?;
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() || mode & 0o077 == 0 {
            continue;
        }
        set_mode(&path, mode & 0o700)?;
        tightened.push(format!(
            "{} ({mode:o})",
            entry.file_name().to_string_lossy()
        ));
    }
    if !tightened.is_empty() {
        tracing::info!(
            dir = %dir.display(),
            "took other users' access off {}: {}",
            if tightened.len() == 1 { "one entry" } else { "entries" },
            tightened.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn test_a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDir::acquire(dir.path()).unwrap();
        // flock locks belong to the open file description: a second open in this
        // same process conflicts like another process would.
        let err = DataDir::acquire(dir.path()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Locked);
        let pid = std::process::id().to_string();
        assert!(err.to_string().contains(&format!("pid {pid}")), "{err}");
        drop(first);
        DataDir::acquire(dir.path()).unwrap();
    }

    #[test]
    fn test_a_new_data_directory_and_its_lock_are_the_nodes_users_only() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("a/b/data");
        let d = DataDir::acquire(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("node.lock")), 0o600);
        let gid = std::os::unix::fs::MetadataExt::gid(&std::fs::metadata(&dir).unwrap());
        d.open_to(gid).unwrap();
        assert_eq!(mode(&dir), 0o710);
    }

    #[test]
    fn test_a_directory_left_open_by_an_older_node_is_closed_at_start() {
        use std::os::unix::fs::symlink;
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("data");
        // As an older drove left it under umask 022.
        std::fs::create_dir_all(dir.join("store/objects")).unwrap();
        std::fs::write(dir.join("store/objects/obj"), b"data").unwrap();
        std::fs::write(dir.join("recovery.json"), b"{}").unwrap();
        std::fs::write(dir.join("node.lock"), b"1\n").unwrap();
        let outside = top.path().join("outside");
        std::fs::write(&outside, b"not the node's").unwrap();
        symlink(&outside, dir.join("link")).unwrap();
        for p in ["", "store", "store/objects"] {
            std::fs::set_permissions(dir.join(p), Permissions::from_mode(0o755)).unwrap();
        }
        for p in ["store/objects/obj", "recovery.json", "node.lock"] {
            std::fs::set_permissions(dir.join(p), Permissions::from_mode(0o644)).unwrap();
        }
        std::fs::set_permissions(&outside, Permissions::from_mode(0o644)).unwrap();
        let _d = DataDir::acquire(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("store")), 0o700);
        assert_eq!(mode(&dir.join("recovery.json")), 0o600);
        assert_eq!(mode(&dir.join("node.lock")), 0o600);
        // Deeper entries keep their mode: store/ is out of reach now.
        assert_eq!(mode(&dir.join("store/objects/obj")), 0o644);
        // What a symbolic link points to is not the node's to change.
        assert_eq!(mode(&outside), 0o644);
    }
}
