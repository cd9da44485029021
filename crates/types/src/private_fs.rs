//! Files and directories that only the node's user may read or write: every file a
//! node creates in its data directory (objects, checksums, the metadata's database,
//! the recovery state, logs, locks) is made here or with [`options`].
//!
//! A node's data directory holds every VDI's data in clear. It once took its modes
//! from the umask, so under the usual 022 every object file was 0644 in 0755
//! directories, readable by any local user (only the Debian unit's `UMask=0007`
//! kept them to the `drove` group). The mode is given when the file or directory
//! is created, not set afterwards, so there is no moment when it is more open: the
//! umask can only take bits away from 0600 and 0700, never add any.
use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// The mode of every file a node creates: read and write for its user only.
pub const FILE_MODE: u32 = 0o600;
/// The mode of every directory a node creates: its user only.
pub const DIR_MODE: u32 = 0o700;

/// [`OpenOptions`] that create a file with [`FILE_MODE`]; the caller chooses
/// read, write, create and so on as with `OpenOptions::new()`.
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Create directory `path` with [`DIR_MODE`] (its parent must exist).
pub fn create_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().mode(DIR_MODE).create(path)
}

/// Create directory `path` and its missing parents, each with [`DIR_MODE`]; an
/// existing one is left as it is.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// Write `contents` to the file at `path`, created with [`FILE_MODE`] if missing,
/// replacing what it held (as `std::fs::write`).
pub fn write(path: &Path, contents: &[u8]) -> io::Result<()> {
    options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?
        .write_all(contents)
}

/// Replace the file at `path` with `contents` so that a power loss leaves either
/// the old file or the new one, whole: written under `path` with the extension
/// `tmp` ([`FILE_MODE`]), fsynced, renamed over `path`, and the directory fsynced
/// so that the rename itself survives.
pub fn replace_durably(path: &Path, contents: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    // The tests run under the caller's umask (022 usually), which would give 0644
    // and 0755; the e2e test `test_a_node_under_umask_000_keeps_its_data_dir_private`
    // runs real nodes under umask 000.
    #[test]
    fn test_files_and_directories_are_created_for_the_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a");
        create_dir(&sub).unwrap();
        assert_eq!(mode(&sub), 0o700);
        let deep = dir.path().join("b/c/d");
        create_dir_all(&deep).unwrap();
        for p in ["b", "b/c", "b/c/d"] {
            assert_eq!(mode(&dir.path().join(p)), 0o700, "{p}");
        }
        let f = sub.join("f");
        write(&f, b"x").unwrap();
        assert_eq!(mode(&f), 0o600);
        let g = sub.join("g");
        options().write(true).create(true).open(&g).unwrap();
        assert_eq!(mode(&g), 0o600);
        // An existing directory is left alone.
        create_dir_all(dir.path()).unwrap();
    }

    #[test]
    fn test_replace_durably_replaces_whole_files_private_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("record.json");
        replace_durably(&p, b"old").unwrap();
        replace_durably(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(mode(&p), FILE_MODE);
        assert!(!d.path().join("record.tmp").exists());
    }
}
