//! The on-disk tree of a [`FileStore`](crate::FileStore): where each object's files
//! live, creating directories, and making directory entries durable.
//!
//! ```text
//! DIR/objects/<vdi %08x>/<group %06x>/<oid %016x>       data file, sparse
//! DIR/objects/<vdi %08x>/<group %06x>/<oid %016x>.crc   checksum file
//! ```
//!
//! `group` is the object index shifted right by 10: a group directory holds at most
//! 1024 objects (4 GiB of a VDI at 4 MiB objects), so 2048 entries, and a VDI
//! directory holds one entry per 4 GiB. Directories are never removed; an empty one
//! costs one inode.
//!
//! A new directory entry (object created or deleted, directory created) is only
//! durable once its parent directory is fsynced. The parents that gained or lost an
//! entry are remembered in a dirty set that `flush` drains.
use drove_types::{private_fs, Error, ObjectId, Result, VdiId};
use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// log2 of the number of objects per group directory.
const GROUP_SHIFT: u32 = 10;

/// Suffix of a checksum file.
const CRC_SUFFIX: &str = ".crc";

/// Paths of one data directory's objects, and its directories awaiting an fsync.
pub(crate) struct Layout {
    /// `DIR/objects`.
    root: PathBuf,
    /// Directories whose entries changed since they were last fsynced. The lock is
    /// held across the fsyncs so that a flush that finds the set empty knows that no
    /// other flush is still syncing a directory it depends on.
    dirty_dirs: Mutex<BTreeSet<PathBuf>>,
    /// Where an object's version is kept in its checksum file: just past the
    /// checksums of the largest object.
    version_at: u64,
}

impl Layout {
    /// The layout under data directory `dir` for objects of at most `object_size`
    /// bytes, creating `dir/objects` if needed.
    pub(crate) fn open(dir: &Path, object_size: u64) -> Result<Layout> {
        let root = dir.join("objects");
        let layout = Layout {
            root: root.clone(),
            dirty_dirs: Mutex::new(BTreeSet::new()),
            version_at: object_size / drove_types::BLOCK_SIZE * crate::crc::CRC_LEN as u64,
        };
        match private_fs::create_dir(&root) {
            Ok(()) => layout.mark_dirty(dir.to_path_buf()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(format!("create {}", root.display()), e)),
        }
        Ok(layout)
    }

    /// `DIR/objects`.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    fn vdi_dir(&self, vdi: VdiId) -> PathBuf {
        self.root.join(format!("{:08x}", vdi.0))
    }

    fn group_dir(&self, oid: ObjectId) -> PathBuf {
        self.vdi_dir(oid.vdi)
            .join(format!("{:06x}", oid.index >> GROUP_SHIFT))
    }

    /// The data file of `oid`.
    pub(crate) fn data_path(&self, oid: ObjectId) -> PathBuf {
        self.group_dir(oid).join(oid.to_string())
    }

    /// The offset of the version record in a checksum file.
    pub(crate) fn version_at(&self) -> u64 {
        self.version_at
    }

    /// The checksum file of `oid`.
    pub(crate) fn crc_path(&self, oid: ObjectId) -> PathBuf {
        self.group_dir(oid).join(format!("{oid}{CRC_SUFFIX}"))
    }

    /// Create the directories that will hold `oid`, remembering each parent that
    /// gained an entry.
    pub(crate) fn ensure_dirs(&self, oid: ObjectId) -> Result<()> {
        let vdi = self.vdi_dir(oid.vdi);
        let group = self.group_dir(oid);
        if self.create_dir(&group, &vdi)? {
            return Ok(());
        }
        // The VDI directory is missing too (NotFound from the first attempt).
        self.create_dir(&vdi, &self.root)?;
        if !self.create_dir(&group, &vdi)? {
            return Err(Error::io(
                format!("create {}", group.display()),
                io::Error::from(io::ErrorKind::NotFound),
            ));
        }
        Ok(())
    }

    /// mkdir `path` (mode 0700). Ok(true) if it exists now, Ok(false) if `parent`
    /// is missing.
    fn create_dir(&self, path: &Path, parent: &Path) -> Result<bool> {
        match private_fs::create_dir(path) {
            Ok(()) => {
                self.mark_dirty(parent.to_path_buf());
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(format!("create {}", path.display()), e)),
        }
    }

    /// Remember that the directory holding `oid` gained or lost an entry.
    pub(crate) fn mark_object_dir_dirty(&self, oid: ObjectId) {
        self.mark_dirty(self.group_dir(oid));
    }

    fn mark_dirty(&self, dir: PathBuf) {
        self.lock_dirty().insert(dir);
    }

    fn lock_dirty(&self) -> MutexGuard<'_, BTreeSet<PathBuf>> {
        self.dirty_dirs.lock()
    }

    /// fsync every directory whose entries changed since its last fsync. A directory
    /// that fails stays in the set.
    pub(crate) fn sync_dirs(&self) -> Result<()> {
        let mut dirty = self.lock_dirty();
        while let Some(dir) = dirty.pop_first() {
            let synced = File::open(&dir).and_then(|d| d.sync_all());
            match synced {
                Ok(()) => {}
                // Nothing left to make durable under a directory that is gone.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let msg = format!("fsync {}", dir.display());
                    dirty.insert(dir);
                    return Err(Error::io(msg, e));
                }
            }
        }
        Ok(())
    }

    /// Call `f` with every object found on disk and the path of its data file.
    pub(crate) fn for_each_object(
        &self,
        mut f: impl FnMut(ObjectId, &Path) -> Result<()>,
    ) -> Result<()> {
        for vdi_dir in read_dir(&self.root)? {
            if !vdi_dir.is_dir() {
                continue;
            }
            for group_dir in read_dir(&vdi_dir)? {
                if !group_dir.is_dir() {
                    continue;
                }
                for file in read_dir(&group_dir)? {
                    let name = file.file_name().and_then(|n| n.to_str());
                    if let Some(oid) = name.and_then(parse_data_name) {
                        f(oid, &file)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The entries of `dir`; a directory removed meanwhile has none.
fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
    };
    entries
        .map(|e| {
            e.map(|e| e.path())
                .map_err(|e| Error::io(format!("list {}", dir.display()), e))
        })
        .collect()
}

/// The object named by a data file name (16 lower-case hex digits), if it is one.
fn parse_data_name(name: &str) -> Option<ObjectId> {
    if name.len() != 16 || !name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(name, 16).ok().map(ObjectId::from_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths_split_by_vdi_and_group() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open(dir.path(), 4 << 20).unwrap();
        let oid = ObjectId::new(VdiId(0xab), 0x1234);
        let data = layout.data_path(oid);
        let tail: Vec<_> = data.iter().rev().take(4).collect();
        assert_eq!(tail[0], "000000ab00001234");
        assert_eq!(tail[1], "000004");
        assert_eq!(tail[2], "000000ab");
        assert_eq!(tail[3], "objects");
        assert_eq!(
            layout.crc_path(oid).file_name().unwrap(),
            "000000ab00001234.crc"
        );
    }

    #[test]
    fn test_parse_data_name_accepts_only_data_files() {
        let oid = ObjectId::new(VdiId(3), 9);
        assert_eq!(parse_data_name(&oid.to_string()), Some(oid));
        assert_eq!(parse_data_name("0000000300000009.crc"), None);
        assert_eq!(parse_data_name("000000030000000G"), None);
        assert_eq!(parse_data_name("000000030000000A"), None);
        assert_eq!(parse_data_name("03"), None);
    }

    #[test]
    fn test_created_dirs_are_synced_once() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open(dir.path(), 4 << 20).unwrap();
        layout.ensure_dirs(ObjectId::new(VdiId(1), 0)).unwrap();
        // objects/ created -> DIR dirty; vdi dir -> objects/ dirty; group -> vdi dirty.
        assert_eq!(layout.lock_dirty().len(), 3);
        layout.sync_dirs().unwrap();
        assert!(layout.lock_dirty().is_empty());
        layout.ensure_dirs(ObjectId::new(VdiId(1), 1)).unwrap();
        assert!(layout.lock_dirty().is_empty());
    }
}
