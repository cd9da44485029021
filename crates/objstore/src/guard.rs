//! [`GuardedStore`]: a store that, once its disk has failed, answers nothing more.
//!
//! A read or write that fails with EIO (or EROFS, ENXIO, ENODEV: the filesystem
//! went read-only after an error, the device went away) and **any** failed flush
//! latch the store as failed. After a failed fsync the state of the page cache is
//! unknown: Linux may have dropped the dirty pages and marked them clean, so a
//! retry can succeed without the data ever reaching the disk (PostgreSQL's
//! "fsyncgate"). Nothing this disk says can be trusted from then on, so every later
//! call fails with an [`ErrorKind::Io`] error that names the disk and its first
//! failure; the node marks itself down and the other copies are re-replicated
//! (docs/self-healing.md, "A failed disk"). The latch holds until the process ends:
//! a restart on a replaced disk starts afresh.
//!
//! A full disk (ENOSPC, EDQUOT: [`ErrorKind::NoSpace`]) is not a failed one and
//! never latches; neither does a checksum mismatch (bit rot, repaired from
//! another copy) nor any error that is not [`ErrorKind::Io`].
use crate::{DiskSpace, ObjectStore, Usage};
use drove_types::{Error, ErrorKind, ObjVersion, ObjectId, Result, VdiId};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// Why a disk was judged failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFailure {
    /// The store's directory.
    pub path: String,
    /// The first failure seen, e.g. `EIO: object ...: write: Input/output error`.
    pub first: String,
    /// When, ms since the Unix epoch.
    pub at_unix_ms: u64,
}

impl DiskFailure {
    /// The one-line error every call answers once the disk failed.
    pub fn message(&self) -> String {
        format!(
            "The disk at {} failed ({}) at {}: this node serves nothing from it",
            self.path,
            self.first,
            utc(self.at_unix_ms / 1000)
        )
    }
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc(secs: u64) -> String {
    drove_types::Utc::from_unix(secs).to_string()
}

/// The name of the errno that marks a disk failed on a read or write, if `e` is one.
fn failed_errno(e: &Error) -> Option<&'static str> {
    let io = std::error::Error::source(e)?.downcast_ref::<std::io::Error>()?;
    match io.raw_os_error()? {
        libc::EIO => Some("EIO"),
        libc::EROFS => Some("EROFS"),
        libc::ENXIO => Some("ENXIO"),
        libc::ENODEV => Some("ENODEV"),
        _ => None,
    }
}

/// What `e`, from a flush (`flush`) or another call, says about the disk: the
/// first-failure text when it failed.
fn judge(flush: bool, e: &Error) -> Option<String> {
    if e.kind() != ErrorKind::Io {
        return None;
    }
    if flush {
        return Some(format!("fsync failed: {e}"));
    }
    failed_errno(e).map(|name| format!("{name}: {e}"))
}

/// A store that refuses everything once its disk has failed (see the module doc).
pub struct GuardedStore {
    inner: Arc<dyn ObjectStore>,
    path: String,
    failed: OnceLock<DiskFailure>,
}

impl GuardedStore {
    /// `inner`, whose directory `path` names the disk in errors.
    pub fn new(inner: Arc<dyn ObjectStore>, path: impl Into<String>) -> GuardedStore {
        GuardedStore {
            inner,
            path: path.into(),
            failed: OnceLock::new(),
        }
    }

    /// Why the disk failed, once it has.
    pub fn failure(&self) -> Option<&DiskFailure> {
        self.failed.get()
    }

    fn refused(&self, f: &DiskFailure) -> Error {
        Error::new(ErrorKind::Io, f.message())
    }

    /// Run `op` unless the disk failed; latch on a failure that says it did.
    fn guard<T>(&self, flush: bool, op: impl FnOnce(&dyn ObjectStore) -> Result<T>) -> Result<T> {
        if let Some(f) = self.failed.get() {
            return Err(self.refused(f));
        }
        match op(self.inner.as_ref()) {
            Ok(v) => Ok(v),
            Err(e) => match judge(flush, &e) {
                Some(first) => {
                    let f = self.failed.get_or_init(|| DiskFailure {
                        path: self.path.clone(),
                        first,
                        at_unix_ms: drove_types::clock::unix_ms(),
                    });
                    Err(self.refused(f))
                }
                None => Err(e),
            },
        }
    }
}

impl ObjectStore for GuardedStore {
    fn read(&self, oid: ObjectId, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.guard(false, |s| s.read(oid, offset, len))
    }

    fn read_bytes(&self, oid: ObjectId, offset: u64, len: u32) -> Result<bytes::Bytes> {
        self.guard(false, |s| s.read_bytes(oid, offset, len))
    }

    fn read_unverified(&self, oid: ObjectId, block: u64) -> Result<Vec<u8>> {
        self.guard(false, |s| s.read_unverified(oid, block))
    }

    fn write(&self, oid: ObjectId, offset: u64, data: &[u8]) -> Result<()> {
        self.guard(false, |s| s.write(oid, offset, data))
    }

    fn create(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<()> {
        self.guard(false, |s| s.create(oid, data, version))
    }

    fn replace(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<u64> {
        self.guard(false, |s| s.replace(oid, data, version))
    }

    fn write_zeroes(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()> {
        self.guard(false, |s| s.write_zeroes(oid, offset, len))
    }

    fn flush(&self, oids: &[ObjectId]) -> Result<()> {
        self.guard(true, |s| s.flush(oids))
    }

    fn version(&self, oid: ObjectId) -> Result<ObjVersion> {
        self.guard(false, |s| s.version(oid))
    }

    fn set_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        self.guard(false, |s| s.set_version(oid, version))
    }

    fn raise_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        self.guard(false, |s| s.raise_version(oid, version))
    }

    fn write_versioned(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        version: ObjVersion,
    ) -> Result<()> {
        self.guard(false, |s| s.write_versioned(oid, offset, data, version))
    }

    fn start_writeback(&self, oid: ObjectId) -> Result<()> {
        self.guard(false, |s| s.start_writeback(oid))
    }

    fn content_crc(&self, oid: ObjectId, len: u32) -> Result<u32> {
        self.guard(false, |s| s.content_crc(oid, len))
    }

    fn exists(&self, oid: ObjectId) -> Result<bool> {
        self.guard(false, |s| s.exists(oid))
    }

    fn delete(&self, oid: ObjectId) -> Result<()> {
        self.guard(false, |s| s.delete(oid))
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        self.guard(false, |s| s.list())
    }

    // Reporting only: answered as the disk allows, and never a verdict on it.
    fn used_bytes(&self) -> Result<u64> {
        self.inner.used_bytes()
    }

    fn usage(&self) -> Result<BTreeMap<VdiId, Usage>> {
        self.inner.usage()
    }

    fn disk_space(&self) -> Option<DiskSpace> {
        self.inner.disk_space()
    }

    fn never_blocks(&self) -> bool {
        self.inner.never_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FaultyStore, MemStore};
    use std::time::Duration;

    fn faulty(dir: &tempfile::TempDir) -> (GuardedStore, std::path::PathBuf) {
        let control = dir.path().join("faults");
        let inner = FaultyStore::with_interval(
            Arc::new(MemStore::new(1 << 20)),
            control.clone(),
            Duration::ZERO,
        );
        (
            GuardedStore::new(Arc::new(inner), "/srv/drove/store"),
            control,
        )
    }

    #[test]
    fn test_an_eio_latches_and_every_later_call_is_refused_naming_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (s, control) = faulty(&dir);
        let oid = ObjectId::new(VdiId(1), 0);
        s.write(oid, 0, &[5u8; 4096]).unwrap();
        s.flush(&[]).unwrap();
        assert!(s.failure().is_none());
        std::fs::write(&control, "eio").unwrap();
        let e = s.write(oid, 0, &[6u8; 4096]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        let msg = e.to_string();
        assert!(
            msg.starts_with("The disk at /srv/drove/store failed (EIO: object "),
            "{msg}"
        );
        assert!(msg.contains(": write"), "{msg}");
        assert!(msg.ends_with("this node serves nothing from it"), "{msg}");
        let f = s.failure().unwrap().clone();
        // The disk works again: the store still serves nothing, and says why with
        // the first failure.
        std::fs::remove_file(&control).unwrap();
        for e in [
            s.read(oid, 0, 4096).unwrap_err(),
            s.flush(&[]).unwrap_err(),
            s.list().unwrap_err(),
            s.version(oid).unwrap_err(),
            s.exists(oid).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::Io);
            assert_eq!(e.to_string(), f.message());
        }
        assert_eq!(s.failure(), Some(&f));
    }

    #[test]
    fn test_a_failed_fsync_latches_even_though_writes_still_work() {
        let mem = Arc::new(MemStore::new(1 << 20));
        let s = GuardedStore::new(mem.clone(), "/d");
        let oid = ObjectId::new(VdiId(1), 0);
        s.write(oid, 0, &[1u8; 4096]).unwrap();
        mem.fail_flushes(true);
        let e = s.flush(&[oid]).unwrap_err();
        assert!(e.to_string().contains("(fsync failed: "), "{e}");
        // A retried fsync that succeeds proves nothing (fsyncgate): still refused.
        mem.fail_flushes(false);
        assert_eq!(s.flush(&[oid]).unwrap_err().kind(), ErrorKind::Io);
        assert_eq!(s.read(oid, 0, 4096).unwrap_err().kind(), ErrorKind::Io);
    }

    #[test]
    fn test_a_full_disk_and_other_errors_do_not_latch() {
        let dir = tempfile::tempdir().unwrap();
        let (s, control) = faulty(&dir);
        let oid = ObjectId::new(VdiId(1), 0);
        std::fs::write(&control, "enospc").unwrap();
        let e = s.write(oid, 0, &[1u8; 4096]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        // A bad request, a checksum mismatch, an I/O error that is not a disk's.
        assert_eq!(
            s.read(oid, 1 << 20, 4096).unwrap_err().kind(),
            ErrorKind::Invalid
        );
        let other = Error::io("open", std::io::Error::from_raw_os_error(libc::EMFILE));
        assert!(judge(false, &other).is_none());
        assert!(judge(false, &Error::new(ErrorKind::Corrupt, "crc")).is_none());
        assert!(judge(true, &Error::new(ErrorKind::NoSpace, "full")).is_none());
        std::fs::remove_file(&control).unwrap();
        assert!(s.failure().is_none());
        s.write(oid, 0, &[2u8; 4096]).unwrap();
        s.flush(&[]).unwrap();
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![2u8; 4096]);
    }

    #[test]
    fn test_utc_formats_unix_seconds() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_800_000_000), "2027-01-15T08:00:00Z");
    }
}
