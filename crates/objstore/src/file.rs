//! [`FileStore`]: the [`ObjectStore`] of a node, one sparse file per object under
//! its data directory (layout in `layout`, checksums in `crc`, per-object I/O in
//! `objfile`).
use crate::cache::FdCache;
use crate::dirty::DirtySet;
use crate::layout::Layout;
use crate::objfile::ObjFile;
use crate::space::Reserve;
use crate::{check_object_size, check_range, sys, ObjectStore};
use drove_types::{private_fs, Error, ObjVersion, ObjectId, Result};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

/// Most objects whose files stay open.
const MAX_CACHED_OBJECTS: u64 = 1024;

/// The object store of one node, on a local file system.
pub struct FileStore {
    object_size: u64,
    layout: Layout,
    cache: FdCache,
    dirty: DirtySet,
    /// The free space kept for the rest of the node (see `space`).
    reserve: Reserve,
    /// Holds the `flock` on `DIR/LOCK` for the store's lifetime.
    _lock: File,
}

impl FileStore {
    /// Open (creating if needed) the store in data directory `dir`, for objects of at
    /// most `object_size` bytes (a multiple of 4 KiB; 4 MiB by default in drove).
    /// Fails with `Unavailable` if another store has `dir` open. Keeps the default
    /// reserve free on its file system ([`crate::default_reserve`]).
    pub fn open(dir: &Path, object_size: u64) -> Result<FileStore> {
        FileStore::open_reserving(dir, object_size, None)
    }

    /// [`FileStore::open`], keeping `reserve` bytes free on the file system for
    /// the rest of the node (`None`: the default for its size): below that, writes
    /// that need new blocks fail with `NoSpace` (see `space`).
    pub fn open_reserving(dir: &Path, object_size: u64, reserve: Option<u64>) -> Result<FileStore> {
        check_object_size(object_size)?;
        // Objects are VDI data in clear: their user only (drove_types::private_fs).
        private_fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let lock_path = dir.join("LOCK");
        let lock = private_fs::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| Error::io(format!("open {}", lock_path.display()), e))?;
        // An exclusive flock, not waited for: two stores on one data directory would
        // each have their own per-object locks and could tear blocks. It goes away
        // when the file is closed.
        lock.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => {
                Error::unavailable(format!("data directory {} is in use", dir.display()))
            }
            std::fs::TryLockError::Error(e) => {
                Error::io(format!("lock {}", lock_path.display()), e)
            }
        })?;
        let layout = Layout::open(dir, object_size)?;
        // Each cached object holds two descriptors: use at most half of the limit,
        // the rest is for sockets and everything else.
        let capacity = sys::nofile_limit().map_or(256, |n| (n / 4).clamp(16, MAX_CACHED_OBJECTS));
        Ok(FileStore {
            object_size,
            layout,
            cache: FdCache::new(capacity as usize),
            dirty: DirtySet::new(),
            reserve: Reserve::new(dir.to_path_buf(), reserve),
            _lock: lock,
        })
    }

    /// The largest object this store holds, in bytes.
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    /// The bytes this store leaves free on its file system.
    pub fn reserve(&self) -> u64 {
        self.reserve.bytes
    }

    /// Refuse a write of `len` bytes at `offset` of `oid` that needs new blocks
    /// while the disk is below the reserve. Looked up without creating the object:
    /// a refused write must not leave an empty object behind (a clone would then
    /// read zeros there instead of its parent's data).
    fn admit_write(&self, oid: ObjectId, offset: u64, len: u64, versioned: bool) -> Result<()> {
        self.reserve.admit(
            || format!("object {oid}: write"),
            || match self.handle(oid, false) {
                Ok(Some(f)) => f.needs_space(offset, len, versioned),
                Ok(None) | Err(_) => Ok(true),
            },
        )
    }

    /// Refuse a new object (created or recovered whole) while the disk is below
    /// the reserve.
    fn admit_new(&self, oid: ObjectId, what: &str) -> Result<()> {
        self.reserve
            .admit(|| format!("object {oid}: {what}"), || Ok(true))
    }

    /// Write `data` (creating the object), then set its version if one is given: one
    /// handle lookup for both, on the path of every client write.
    fn write_then_set(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        version: Option<ObjVersion>,
    ) -> Result<()> {
        check_range(oid, self.object_size, offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.admit_write(oid, offset, data.len() as u64, version.is_some())?;
        let Some(f) = self.handle(oid, true)? else {
            return Err(Error::io(
                format!("object {oid}: create"),
                io::Error::from(io::ErrorKind::NotFound),
            ));
        };
        let res = f
            .write(offset, data)
            .and_then(|()| version.map_or(Ok(()), |v| f.raise_version(v)));
        self.dirty.mark(&f);
        if res.is_ok() && f.note_written(data.len() as u64) {
            // A hint: the flush that makes the data durable reports any disk error.
            let _ = f.start_writeback();
        }
        res
    }

    /// The open handle of `oid`, opening or (if `create`) creating its files.
    fn handle(&self, oid: ObjectId, create: bool) -> Result<Option<Arc<ObjFile>>> {
        self.cache
            .get(oid, || ObjFile::open(&self.layout, oid, create))
    }
}

impl ObjectStore for FileStore {
    fn read(&self, oid: ObjectId, offset: u64, len: u32) -> Result<Vec<u8>> {
        check_range(oid, self.object_size, offset, u64::from(len))?;
        match self.handle(oid, false)? {
            Some(f) => f.read(offset, len),
            None => Ok(vec![0u8; len as usize]),
        }
    }

    fn write(&self, oid: ObjectId, offset: u64, data: &[u8]) -> Result<()> {
        self.write_then_set(oid, offset, data, None)
    }

    fn read_unverified(&self, oid: ObjectId, block: u64) -> Result<Vec<u8>> {
        let bs = drove_types::BLOCK_SIZE;
        check_range(oid, self.object_size, block.saturating_mul(bs), bs)?;
        match self.handle(oid, false)? {
            Some(f) => f.read_unverified(block),
            None => Ok(vec![0u8; bs as usize]),
        }
    }

    fn content_crc(&self, oid: ObjectId, len: u32) -> Result<u32> {
        check_range(oid, self.object_size, 0, u64::from(len))?;
        match self.handle(oid, false)? {
            Some(f) => f.content_crc(len),
            None => Ok(crate::zeros_content_crc(len)),
        }
    }

    fn write_versioned(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        version: ObjVersion,
    ) -> Result<()> {
        if data.is_empty() {
            check_range(oid, self.object_size, offset, 0)?;
            return self.raise_version(oid, version);
        }
        self.write_then_set(oid, offset, data, Some(version))
    }

    fn create(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<()> {
        check_range(oid, self.object_size, 0, data.len() as u64)?;
        self.admit_new(oid, "create")?;
        self.layout.ensure_dirs(oid)?;
        let (data_path, crc_path) = (self.layout.data_path(oid), self.layout.crc_path(oid));
        let tmp = |p: &Path| {
            let mut name = p.as_os_str().to_owned();
            name.push(".tmp");
            std::path::PathBuf::from(name)
        };
        let (tmp_data, tmp_crc) = (tmp(&data_path), tmp(&crc_path));
        // Built and synced under names no reader looks at, then renamed in: the
        // object is the old one (or none) until the data file's rename, the new one
        // after. Checksums go first, since the data file's name is what makes the
        // object exist. The shard lock keeps the object from being reopened between
        // the renames; handles already open keep reading the old files.
        ObjFile::write_new(&self.layout, oid, (&tmp_data, &tmp_crc), data, version)?;
        self.cache.remove_then(oid, |handle| {
            self.dirty.forget(oid, handle.as_ref());
            fs::rename(&tmp_crc, &crc_path)
                .map_err(|e| Error::io(format!("object {oid}: rename checksums"), e))?;
            fs::rename(&tmp_data, &data_path)
                .map_err(|e| Error::io(format!("object {oid}: rename"), e))?;
            self.layout.mark_object_dir_dirty(oid);
            Ok(())
        })
    }

    fn replace(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<u64> {
        check_range(oid, self.object_size, 0, data.len() as u64)?;
        // Before the old copy goes: a refused recovery copy keeps it.
        self.admit_new(oid, "recovery copy")?;
        self.delete(oid)?;
        // Creating the handle creates the (empty) data file: the object exists
        // even if `data` is all zeros.
        let Some(f) = self.handle(oid, true)? else {
            return Err(Error::io(
                format!("object {oid}: create"),
                io::Error::from(io::ErrorKind::NotFound),
            ));
        };
        let direct = if sys::direct_ok(data) {
            sys::open_direct(&self.layout.data_path(oid))
                .map_err(|e| Error::io(format!("object {oid}: open for direct writes"), e))?
        } else {
            None
        };
        let res = f
            .write_runs(data, direct.as_ref())
            .and_then(|n| f.set_version(version).map(|()| n));
        self.dirty.mark(&f);
        res
    }

    fn write_zeroes(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()> {
        check_range(oid, self.object_size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // A missing object already reads as zeros: nothing to create.
        let Some(f) = self.handle(oid, false)? else {
            return Ok(());
        };
        let res = f.zero(offset, len);
        self.dirty.mark(&f);
        res
    }

    fn flush(&self, oids: &[ObjectId]) -> Result<()> {
        for f in self.dirty.pick(oids) {
            self.dirty.sync(&f)?;
        }
        // New (or removed) objects are durable only once their directory entries
        // are: done after the files, and even for `oids` that were clean, since
        // their creation may still be in a directory another flush has not synced.
        self.layout.sync_dirs()
    }

    fn start_writeback(&self, oid: ObjectId) -> Result<()> {
        match self.handle(oid, false)? {
            Some(f) => f.start_writeback(),
            None => Ok(()),
        }
    }

    fn version(&self, oid: ObjectId) -> Result<ObjVersion> {
        match self.handle(oid, false)? {
            Some(f) => f.version(),
            None => Ok(ObjVersion::default()),
        }
    }

    fn set_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        let Some(f) = self.handle(oid, false)? else {
            return Ok(());
        };
        let res = f.set_version(version);
        self.dirty.mark(&f);
        res
    }

    fn raise_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        let Some(f) = self.handle(oid, false)? else {
            return Ok(());
        };
        let res = f.raise_version(version);
        self.dirty.mark(&f);
        res
    }

    fn exists(&self, oid: ObjectId) -> Result<bool> {
        let path = self.layout.data_path(oid);
        self.cache
            .cached_or(oid, || match fs::symlink_metadata(&path) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(Error::io(format!("object {oid}: stat"), e)),
            })
    }

    fn delete(&self, oid: ObjectId) -> Result<()> {
        self.cache.remove_then(oid, |handle| {
            // Writes still in flight on `handle` land in the unlinked file and are
            // lost, as if they had come before the delete.
            self.dirty.forget(oid, handle.as_ref());
            // Data first: it is what makes the object exist. A crash before the
            // checksum file goes leaves it behind; creating the object again
            // truncates it.
            let removed = remove_file(&self.layout.data_path(oid))
                .map_err(|e| Error::io(format!("object {oid}: delete"), e))?;
            remove_file(&self.layout.crc_path(oid))
                .map_err(|e| Error::io(format!("object {oid}: delete checksums"), e))?;
            if removed {
                self.layout.mark_object_dir_dirty(oid);
            }
            Ok(())
        })
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        let mut oids = Vec::new();
        self.layout.for_each_object(|oid, _| {
            oids.push(oid);
            Ok(())
        })?;
        Ok(oids)
    }

    fn disk_space(&self) -> Option<crate::DiskSpace> {
        sys::disk_space(self.layout.root())
    }

    fn usage(&self) -> Result<std::collections::BTreeMap<drove_types::VdiId, crate::Usage>> {
        let mut out: std::collections::BTreeMap<_, crate::Usage> = Default::default();
        self.layout.for_each_object(|oid, path| {
            match fs::symlink_metadata(path) {
                Ok(m) => {
                    let u = out.entry(oid.vdi).or_default();
                    u.objects += 1;
                    u.bytes += m.blocks() * 512;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("object {oid}: stat"), e)),
            }
            Ok(())
        })?;
        Ok(out)
    }

    fn used_bytes(&self) -> Result<u64> {
        let mut total = 0u64;
        self.layout.for_each_object(|oid, path| {
            match fs::symlink_metadata(path) {
                Ok(m) => total += m.blocks() * 512,
                // Deleted while we walked.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("object {oid}: stat"), e)),
            }
            Ok(())
        })?;
        Ok(total)
    }
}

/// Unlink `path`; Ok(false) if it was already gone.
fn remove_file(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::{ErrorKind, VdiId};

    const OBJ: u64 = 4 << 20;

    #[test]
    fn test_second_open_of_a_directory_is_refused_until_drop() {
        let dir = tempfile::tempdir().unwrap();
        let a = FileStore::open(dir.path(), OBJ).unwrap();
        let e = FileStore::open(dir.path(), OBJ).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        drop(a);
        FileStore::open(dir.path(), OBJ).unwrap();
    }

    /// Every entry under `dir` with its permission bits.
    fn modes(dir: &Path) -> Vec<(std::path::PathBuf, bool, u32)> {
        use std::os::unix::fs::PermissionsExt;
        let mut out = Vec::new();
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            out.push((p.clone(), m.is_dir(), m.permissions().mode() & 0o7777));
            if m.is_dir() {
                out.extend(modes(&p));
            }
        }
        out
    }

    #[test]
    fn test_the_store_creates_its_files_and_directories_for_its_user_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let s = FileStore::open(&root, OBJ).unwrap();
        // A write creates an object in place; a replace builds one under other
        // names and renames them in.
        s.write(ObjectId::new(VdiId(1), 0), 0, &[1u8; 4096])
            .unwrap();
        let v = ObjVersion {
            generation: 1,
            epoch: 1,
        };
        s.replace(ObjectId::new(VdiId(2), 5000), &[2u8; 8192], v)
            .unwrap();
        s.flush(&[]).unwrap();
        let found = modes(dir.path());
        let files = found.iter().filter(|(_, d, _)| !d).count();
        assert_eq!(files, 5, "LOCK and two files per object: {found:?}");
        for (p, is_dir, mode) in &found {
            let want = if *is_dir { 0o700 } else { 0o600 };
            assert_eq!(*mode, want, "{} is {mode:o}", p.display());
        }
    }

    #[test]
    fn test_write_back_starts_after_each_mebibyte_written_to_an_object() {
        use crate::objfile::WRITEBACK_AFTER;
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::open(dir.path(), OBJ).unwrap();
        let oid = ObjectId::new(VdiId(1), 0);
        let block = [5u8; 4096];
        let blocks = WRITEBACK_AFTER / 4096;
        for i in 0..blocks - 1 {
            s.write(oid, i * 4096, &block).unwrap();
        }
        let f = s.handle(oid, false).unwrap().unwrap();
        assert_eq!(f.unstarted(), WRITEBACK_AFTER - 4096);
        s.write(oid, (blocks - 1) * 4096, &block).unwrap();
        assert_eq!(f.unstarted(), 0, "the write-back was started");
        s.write(oid, 0, &[6u8; 100]).unwrap();
        assert_eq!(f.unstarted(), 100);
        // Still dirty until a flush: the write-back is only a hint.
        assert_eq!(s.dirty.len(), 1);
        s.flush(&[]).unwrap();
        assert_eq!(s.read(oid, 4096, 4096).unwrap(), block.to_vec());
        assert_eq!(s.read(oid, 0, 100).unwrap(), vec![6u8; 100]);
    }

    #[test]
    fn test_flush_empties_the_dirty_set() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::open(dir.path(), OBJ).unwrap();
        let (a, b) = (ObjectId::new(VdiId(1), 0), ObjectId::new(VdiId(1), 1));
        s.write(a, 0, &[1; 4096]).unwrap();
        s.write(b, 0, &[2; 4096]).unwrap();
        assert_eq!(s.dirty.len(), 2);
        s.flush(&[a]).unwrap();
        assert_eq!(s.dirty.len(), 1);
        s.flush(&[]).unwrap();
        assert_eq!(s.dirty.len(), 0);
        // Zeroing a missing object neither creates nor dirties it.
        let c = ObjectId::new(VdiId(1), 2);
        s.write_zeroes(c, 0, 4096).unwrap();
        assert_eq!(s.dirty.len(), 0);
        assert!(!s.exists(c).unwrap());
        s.delete(b).unwrap();
        s.write(a, 4096, &[3; 10]).unwrap();
        s.delete(a).unwrap();
        assert_eq!(s.dirty.len(), 0);
    }

    #[test]
    fn test_create_replaces_the_object_whole_and_keeps_zero_blocks_as_holes() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::open(dir.path(), OBJ).unwrap();
        let oid = ObjectId::new(VdiId(3), 5);
        s.write(oid, 0, &[9u8; 8192]).unwrap();
        let _open = s.read(oid, 0, 4096).unwrap();
        let mut content = vec![0u8; OBJ as usize];
        content[4096..8192].fill(7);
        content[OBJ as usize - 10..].fill(1);
        s.create(oid, &content, ObjVersion::default()).unwrap();
        assert_eq!(s.read(oid, 0, OBJ as u32).unwrap(), content);
        s.flush(&[oid]).unwrap();
        let used = s.used_bytes().unwrap();
        assert!(
            used <= 3 * 4096,
            "zero blocks stay holes: {used} bytes used"
        );
        assert_eq!(s.list().unwrap(), vec![oid], "no temporary file is listed");
        // Reopened from disk, the checksums verify.
        drop(s);
        let s = FileStore::open(dir.path(), OBJ).unwrap();
        assert_eq!(s.read(oid, 0, OBJ as u32).unwrap(), content);
        let fresh = ObjectId::new(VdiId(3), 6);
        s.create(fresh, &[5u8; 100], ObjVersion::default()).unwrap();
        assert_eq!(
            s.read(fresh, 0, 4096).unwrap()[..101],
            [[5u8; 100].as_slice(), &[0]].concat()
        );
    }

    #[test]
    fn test_cache_stays_bounded_and_evicted_objects_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::open(dir.path(), OBJ).unwrap();
        let n = 3 * MAX_CACHED_OBJECTS as u32;
        for i in 0..n {
            s.write(
                ObjectId::new(VdiId(2), i),
                4096 * u64::from(i % 7),
                &i.to_le_bytes(),
            )
            .unwrap();
            if i % 64 == 0 {
                s.flush(&[]).unwrap();
            }
        }
        s.flush(&[]).unwrap();
        // Objects dirty when inserted could not be evicted: at most 64 between flushes.
        assert!(s.cache.len() <= MAX_CACHED_OBJECTS as usize + 64);
        for i in 0..n {
            let got = s
                .read(ObjectId::new(VdiId(2), i), 4096 * u64::from(i % 7), 4)
                .unwrap();
            assert_eq!(got, i.to_le_bytes());
        }
    }
}
