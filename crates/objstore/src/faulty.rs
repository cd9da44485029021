//! [`FaultyStore`]: a test-only hook that makes a node's store fail as a dying disk
//! does, switched by the content of a control file. The daemon wraps its store in
//! one only when `DROVE_DISK_FAULTS` names such a file at start (docs/self-healing.md,
//! "A failed disk"); nothing else ever builds one.
//!
//! The file is read at most once per [`CHECK_EVERY`] (by the call that finds the
//! last look too old, never a `stat` per I/O). Its content, trimmed:
//!
//! - absent or empty: healthy, every call goes to the inner store;
//! - `eio`: every call that touches the disk fails with EIO (os error 5), as on a
//!   disk that died;
//! - `fsync`: every flush fails with EIO, the rest works (a disk whose write-back
//!   fails: what an fsync reports after the page cache lost the data);
//! - `enospc`: every write, zero, create and replace fails with ENOSPC (os error
//!   28): a full disk, which is not a failed one.
//!
//! Anything else is taken as healthy.
use crate::{DiskSpace, ObjectStore, Usage};
use drove_types::{Error, ObjVersion, ObjectId, Result, VdiId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the control file is read at most.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// What the control file asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Nothing: the inner store answers.
    None = 0,
    /// Every disk access fails with EIO.
    Eio = 1,
    /// Every flush fails with EIO.
    Fsync = 2,
    /// Every write that needs space fails with ENOSPC.
    NoSpace = 3,
}

impl Fault {
    /// The fault a control file's content asks for.
    pub fn parse(text: &str) -> Fault {
        match text.trim() {
            "eio" => Fault::Eio,
            "fsync" => Fault::Fsync,
            "enospc" => Fault::NoSpace,
            _ => Fault::None,
        }
    }

    fn from_u8(v: u8) -> Fault {
        match v {
            1 => Fault::Eio,
            2 => Fault::Fsync,
            3 => Fault::NoSpace,
            _ => Fault::None,
        }
    }
}

/// A store that fails as its control file says (see the module doc).
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    control: PathBuf,
    every: Duration,
    start: Instant,
    /// When the file was last read, ms since `start`, plus one (0: never).
    checked_ms: AtomicU64,
    fault: AtomicU8,
}

impl FaultyStore {
    /// `inner`, failing as `control` says, read at most every [`CHECK_EVERY`].
    pub fn new(inner: Arc<dyn ObjectStore>, control: PathBuf) -> FaultyStore {
        FaultyStore::with_interval(inner, control, CHECK_EVERY)
    }

    /// [`FaultyStore::new`] reading the file at most every `every` (zero: at every
    /// call, for unit tests).
    pub fn with_interval(
        inner: Arc<dyn ObjectStore>,
        control: PathBuf,
        every: Duration,
    ) -> FaultyStore {
        FaultyStore {
            inner,
            control,
            every,
            start: Instant::now(),
            checked_ms: AtomicU64::new(0),
            fault: AtomicU8::new(Fault::None as u8),
        }
    }

    /// The fault in force, reading the control file if the last look is too old.
    pub fn fault(&self) -> Fault {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.checked_ms.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= self.every.as_millis() as u64;
        // One caller reads the file; the others go on with the last answer.
        if due
            && self
                .checked_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let text = std::fs::read_to_string(&self.control).unwrap_or_default();
            self.fault
                .store(Fault::parse(&text) as u8, Ordering::Release);
        }
        Fault::from_u8(self.fault.load(Ordering::Acquire))
    }

    fn errno(&self, what: &str, errno: i32) -> Error {
        Error::io(
            format!("{what} (injected through {})", self.control.display()),
            std::io::Error::from_raw_os_error(errno),
        )
    }

    /// Fail a disk access under `eio`.
    fn access(&self, what: &str) -> Result<()> {
        match self.fault() {
            Fault::Eio => Err(self.errno(what, libc::EIO)),
            _ => Ok(()),
        }
    }

    /// Fail a write that may need space under `eio` and `enospc`.
    fn space(&self, what: &str) -> Result<()> {
        match self.fault() {
            Fault::Eio => Err(self.errno(what, libc::EIO)),
            Fault::NoSpace => Err(self.errno(what, libc::ENOSPC)),
            _ => Ok(()),
        }
    }
}

impl ObjectStore for FaultyStore {
    fn read(&self, oid: ObjectId, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.access(&format!("object {oid}: read"))?;
        self.inner.read(oid, offset, len)
    }

    fn read_bytes(&self, oid: ObjectId, offset: u64, len: u32) -> Result<bytes::Bytes> {
        self.access(&format!("object {oid}: read"))?;
        self.inner.read_bytes(oid, offset, len)
    }

    fn read_unverified(&self, oid: ObjectId, block: u64) -> Result<Vec<u8>> {
        self.access(&format!("object {oid}: read"))?;
        self.inner.read_unverified(oid, block)
    }

    fn write(&self, oid: ObjectId, offset: u64, data: &[u8]) -> Result<()> {
        self.space(&format!("object {oid}: write"))?;
        self.inner.write(oid, offset, data)
    }

    fn create(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<()> {
        self.space(&format!("object {oid}: create"))?;
        self.inner.create(oid, data, version)
    }

    fn replace(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<u64> {
        self.space(&format!("object {oid}: replace"))?;
        self.inner.replace(oid, data, version)
    }

    fn write_zeroes(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()> {
        self.space(&format!("object {oid}: zero"))?;
        self.inner.write_zeroes(oid, offset, len)
    }

    fn flush(&self, oids: &[ObjectId]) -> Result<()> {
        match self.fault() {
            Fault::Eio | Fault::Fsync => Err(self.errno("fsync", libc::EIO)),
            _ => self.inner.flush(oids),
        }
    }

    fn version(&self, oid: ObjectId) -> Result<ObjVersion> {
        self.access(&format!("object {oid}: read the version"))?;
        self.inner.version(oid)
    }

    fn set_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        self.access(&format!("object {oid}: set the version"))?;
        self.inner.set_version(oid, version)
    }

    fn raise_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        self.access(&format!("object {oid}: set the version"))?;
        self.inner.raise_version(oid, version)
    }

    fn write_versioned(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        version: ObjVersion,
    ) -> Result<()> {
        self.space(&format!("object {oid}: write"))?;
        self.inner.write_versioned(oid, offset, data, version)
    }

    fn start_writeback(&self, oid: ObjectId) -> Result<()> {
        self.inner.start_writeback(oid)
    }

    fn content_crc(&self, oid: ObjectId, len: u32) -> Result<u32> {
        self.access(&format!("object {oid}: read the checksums"))?;
        self.inner.content_crc(oid, len)
    }

    fn exists(&self, oid: ObjectId) -> Result<bool> {
        self.access(&format!("object {oid}: stat"))?;
        self.inner.exists(oid)
    }

    fn delete(&self, oid: ObjectId) -> Result<()> {
        self.access(&format!("object {oid}: delete"))?;
        self.inner.delete(oid)
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        self.access("list the objects")?;
        self.inner.list()
    }

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
    use crate::MemStore;
    use drove_types::ErrorKind;

    fn store(dir: &tempfile::TempDir) -> (FaultyStore, PathBuf) {
        let control = dir.path().join("faults");
        let s = FaultyStore::with_interval(
            Arc::new(MemStore::new(1 << 20)),
            control.clone(),
            Duration::ZERO,
        );
        (s, control)
    }

    fn errno(e: &Error) -> Option<i32> {
        std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .and_then(|e| e.raw_os_error())
    }

    #[test]
    fn test_the_control_file_switches_the_faults_on_and_off() {
        let dir = tempfile::tempdir().unwrap();
        let (s, control) = store(&dir);
        let oid = ObjectId::new(VdiId(1), 0);
        // No file: healthy.
        s.write(oid, 0, &[7u8; 4096]).unwrap();
        s.flush(&[]).unwrap();
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![7u8; 4096]);

        std::fs::write(&control, "eio\n").unwrap();
        for e in [
            s.read(oid, 0, 4096).unwrap_err(),
            s.write(oid, 0, &[1u8; 4096]).unwrap_err(),
            s.flush(&[]).unwrap_err(),
            s.list().unwrap_err(),
            s.version(oid).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::Io, "{e}");
            assert_eq!(errno(&e), Some(libc::EIO), "{e}");
            assert!(e.to_string().contains("injected"), "{e}");
        }

        std::fs::write(&control, "fsync").unwrap();
        s.write(oid, 0, &[2u8; 4096]).unwrap();
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![2u8; 4096]);
        let e = s.flush(&[oid]).unwrap_err();
        assert_eq!((e.kind(), errno(&e)), (ErrorKind::Io, Some(libc::EIO)));

        std::fs::write(&control, "enospc").unwrap();
        let e = s.write(oid, 0, &[3u8; 4096]).unwrap_err();
        assert_eq!(
            (e.kind(), errno(&e)),
            (ErrorKind::NoSpace, Some(libc::ENOSPC))
        );
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![2u8; 4096]);
        s.flush(&[]).unwrap();

        // Emptied, or removed: healthy again.
        std::fs::write(&control, "").unwrap();
        s.write(oid, 0, &[4u8; 4096]).unwrap();
        std::fs::write(&control, "eio").unwrap();
        assert!(s.read(oid, 0, 4096).is_err());
        std::fs::remove_file(&control).unwrap();
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![4u8; 4096]);
    }

    #[test]
    fn test_the_file_is_read_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("faults");
        let s = FaultyStore::with_interval(
            Arc::new(MemStore::new(1 << 20)),
            control.clone(),
            Duration::from_secs(3600),
        );
        let oid = ObjectId::new(VdiId(1), 0);
        assert_eq!(s.fault(), Fault::None);
        std::fs::write(&control, "eio").unwrap();
        // Within the interval the last answer stands: no read of the file per call.
        assert_eq!(s.fault(), Fault::None);
        s.write(oid, 0, &[1u8; 512]).unwrap();
    }

    #[test]
    fn test_unknown_content_is_healthy() {
        assert_eq!(Fault::parse(" eio \n"), Fault::Eio);
        assert_eq!(Fault::parse("fsync"), Fault::Fsync);
        assert_eq!(Fault::parse("EIO"), Fault::None);
        assert_eq!(Fault::parse("whatever"), Fault::None);
    }
}
