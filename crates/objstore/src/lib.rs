//! drove-objstore: layer 6 of the data path, the object store of one node.
//!
//! A node's replica side (drove-replica's `LocalStore`) hands every object read,
//! write, zero and flush that lands on this node to an [`ObjectStore`]. [`FileStore`] keeps one sparse file per
//! object under the node's data directory with a crc32c per 4 KiB block that is
//! verified on every read; [`MemStore`] is an in-memory stand-in with the same
//! semantics for the tests of other crates. [`GuardedStore`] wraps a node's store
//! and refuses everything once its disk failed (EIO, a failed fsync);
//! [`FaultyStore`] is the test-only hook that makes a store fail that way.
//!
//! The on-disk layout is described in the `layout` module; in short:
//!
//! ```text
//! DIR/LOCK                                  flock'ed while a FileStore has DIR open
//! DIR/objects/<vdi %08x>/<index>>10 %06x>/<oid %016x>      data, sparse, <= object_size
//! DIR/objects/<vdi %08x>/<index>>10 %06x>/<oid %016x>.crc  4 bytes LE per 4 KiB block
//! ```
//!
//! Durability: a write is in the page cache when `write` returns; `flush` makes it
//! durable (fdatasync of the data and checksum files, fsync of the directories that
//! gained or lost an entry). Within one write the data is written before its
//! checksums, so a crash between the two leaves blocks that read as
//! [`ErrorKind::Corrupt`](drove_types::ErrorKind::Corrupt); the replica layer repairs
//! such blocks from another copy. The same holds for un-flushed writes in general: the
//! kernel may write back the data and checksum pages in any order.
//!
//! The API is synchronous: async callers run it on tokio's blocking pool
//! (drove-replica's `local::blocking`), except writes of up to 64 KiB without FUA
//! (they land in the page cache) and every call to a store that
//! [never blocks](ObjectStore::never_blocks) (one in memory), which run on the
//! calling task.
#![deny(missing_docs)]

mod cache;
mod crc;
mod dirty;
mod faulty;
mod file;
mod guard;
mod layout;
mod lies;
mod mem;
mod objfile;
mod space;
mod stripes;
mod sys;

pub use faulty::{Fault, FaultyStore};
pub use file::FileStore;
pub use guard::{utc, DiskFailure, GuardedStore};
pub use mem::MemStore;
pub use space::default_reserve;
pub use sys::{disk_space, DiskSpace};

use drove_types::{Error, ObjVersion, ObjectId, Result, BLOCK_SIZE};

/// The object store of one node. Every method may be called concurrently from many
/// threads, on different objects and on the same object.
pub trait ObjectStore: Send + Sync {
    /// Read `len` bytes at `offset` inside object `oid`. A missing object or a
    /// never-written range reads as zeros. Every 4 KiB block touched is checked
    /// against its stored crc32c; a mismatch returns `ErrorKind::Corrupt`.
    fn read(&self, oid: ObjectId, offset: u64, len: u32) -> Result<Vec<u8>>;

    /// [`read`](ObjectStore::read), as [`bytes::Bytes`] (what a peer is sent). The
    /// default wraps `read`'s buffer without copying; a store that keeps no bytes
    /// (the simulator's) answers without allocating one.
    fn read_bytes(&self, oid: ObjectId, offset: u64, len: u32) -> Result<bytes::Bytes> {
        self.read(oid, offset, len).map(bytes::Bytes::from)
    }

    /// Block `block` of `oid` as it lies on the disk, without checking its stored
    /// checksum: for recovery only, to seal again a block that every copy fails
    /// (a write whose data or checksum a power loss kept from the disk). The
    /// default reads it checked, so a store that cannot do this never seals.
    fn read_unverified(&self, oid: ObjectId, block: u64) -> Result<Vec<u8>> {
        self.read(oid, block * BLOCK_SIZE, BLOCK_SIZE as u32)
    }

    /// Write `data` at `offset`, creating the object if needed. An empty `data` only
    /// checks the range. A partial-block write reads the old block (and fails with
    /// `Corrupt` if it does not verify) to recompute its checksum.
    fn write(&self, oid: ObjectId, offset: u64, data: &[u8]) -> Result<()>;

    /// Replace object `oid` by `data` (zeros past its end) atomically: after a crash
    /// the object is either as it was (or missing) or wholly `data`, never a mix.
    /// Used for the copy-up of a clone's object, whose blocks not yet written by the
    /// clone must never read as anything but the parent's data. All-zero blocks are
    /// left as holes. The new object's version is `version`. Durable once `flush`
    /// has synced the directory entry.
    fn create(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<()>;

    /// Replace object `oid` by `data` (zeros past its end) with version `version`,
    /// creating it: recovery's bulk copy. All-zero blocks are left as holes, and an
    /// all-zero `data` still makes the object exist. Returns the bytes stored.
    /// Unlike [`ObjectStore::create`] it is not atomic and not synced: durable after
    /// the next `flush`, and a crash before that can leave part of it (recovery then
    /// copies it again, as its pass was not recorded clean).
    fn replace(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<u64>;

    /// Make `[offset, offset + len)` read as zeros. Whole 4 KiB blocks are punched
    /// out so they take no space. Zeroing a missing object is a no-op.
    fn write_zeroes(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()>;

    /// Make durable every write and zero done so far to these objects. An empty
    /// slice means every object written since its last flush.
    fn flush(&self, oids: &[ObjectId]) -> Result<()>;

    /// The version of the object's last write (see [`ObjVersion`]); zero for a
    /// missing object or one whose version was never set.
    fn version(&self, oid: ObjectId) -> Result<ObjVersion>;

    /// Set the version of an existing object (a missing one is left missing). It is
    /// durable with the object's next flush, like a write.
    fn set_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()>;

    /// Raise the object's version to `version` unless it is already that or later
    /// (a missing object is left missing): what a write does. A write never takes
    /// a copy's version back: zone-sync writes of one object reach a far copy out
    /// of order (the shipper orders writes per 64 KiB chunk, not per object), and a
    /// write made at epoch 17 landing after one made at 19 set the copy back to 17,
    /// below the home copies' version although it held the later write; recovery
    /// then kept a home copy without it (`drove sim faults --seed 10 --time 40s`).
    /// The default reads, compares and sets: stores with concurrent writers
    /// override it to do so atomically.
    fn raise_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        if self.version(oid)? < version {
            self.set_version(oid, version)?;
        }
        Ok(())
    }

    /// [`ObjectStore::write`], then [`ObjectStore::raise_version`]: a client write.
    /// Stores that look an object up once per call override it to do it once.
    fn write_versioned(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        version: ObjVersion,
    ) -> Result<()> {
        self.write(oid, offset, data)?;
        self.raise_version(oid, version)
    }

    /// Start writing the object's data to the disk without waiting: a hint for bulk
    /// writers (recovery) whose flush comes much later, so that the disk works while
    /// they go on. Durability still needs `flush`. The default does nothing.
    fn start_writeback(&self, _oid: ObjectId) -> Result<()> {
        Ok(())
    }

    /// The content digest of the first `len` bytes of `oid` ([`content_crc`]): two
    /// copies have the same one exactly when their blocks' checksums agree. A store
    /// that keeps block checksums reads only those (4 bytes per 4 KiB block), not
    /// the data: so a block whose data rotted under its checksum is not seen here
    /// (a read or a scrub finds it). A missing object digests as zeros. The
    /// default reads the data (and fails on a block that does not verify).
    fn content_crc(&self, oid: ObjectId, len: u32) -> Result<u32> {
        Ok(content_crc(&self.read(oid, 0, len)?))
    }

    /// Whether the object exists (was written and not deleted since).
    fn exists(&self, oid: ObjectId) -> Result<bool>;

    /// Remove the object; removing a missing object succeeds.
    fn delete(&self, oid: ObjectId) -> Result<()>;

    /// Every object stored, in no particular order.
    fn list(&self) -> Result<Vec<ObjectId>>;

    /// Bytes allocated on disk by object data, for reporting.
    fn used_bytes(&self) -> Result<u64>;

    /// Objects and bytes allocated on disk, per VDI, for reporting.
    fn usage(&self) -> Result<std::collections::BTreeMap<drove_types::VdiId, Usage>>;

    /// Size and free space of the disk the store writes to (`None`: unknown, or
    /// no disk). Recovery stops copying onto a disk that is too full.
    fn disk_space(&self) -> Option<DiskSpace> {
        None
    }

    /// Whether no call ever waits on a disk (a store in memory): its calls then run
    /// on the calling task rather than on tokio's blocking pool, which also keeps
    /// the simulator (crates/sim) on one thread and deterministic. The default is
    /// false.
    fn never_blocks(&self) -> bool {
        false
    }
}

/// The content digest of `data` (an object's first bytes): crc32c over the stored
/// checksum of each 4 KiB block, little-endian, in block order (a last partial
/// block counts as padded with zeros). It is what [`ObjectStore::content_crc`]
/// gives from a store's checksums without reading the data, so a copy read and
/// verified and a copy digested from its checksums compare.
pub fn content_crc(data: &[u8]) -> u32 {
    crc::data_digest(data)
}

/// The content digest of `len` bytes of zeros: a missing object's.
pub fn zeros_content_crc(len: u32) -> u32 {
    crc::zeros_digest(u64::from(len))
}

/// What one VDI takes in a store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Objects stored.
    pub objects: u64,
    /// Bytes allocated on disk by their data.
    pub bytes: u64,
}

/// Check that `[offset, offset + len)` lies inside an object of `object_size` bytes.
pub(crate) fn check_range(oid: ObjectId, object_size: u64, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= object_size => Ok(()),
        _ => Err(Error::invalid(format!(
            "object {oid}: range {offset}+{len} is past the object size {object_size}"
        ))),
    }
}

/// Check an object size given to a store: a positive multiple of the block size.
pub(crate) fn check_object_size(object_size: u64) -> Result<()> {
    if object_size == 0 || !object_size.is_multiple_of(BLOCK_SIZE) {
        return Err(Error::invalid(format!(
            "object size {object_size} is not a positive multiple of {BLOCK_SIZE}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::{ErrorKind, VdiId};

    #[test]
    fn test_check_range_rejects_past_end_and_overflow() {
        let oid = ObjectId::new(VdiId(1), 2);
        assert!(check_range(oid, 8192, 4096, 4096).is_ok());
        assert!(check_range(oid, 8192, 8192, 0).is_ok());
        let e = check_range(oid, 8192, 4097, 4096).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
        assert!(e.to_string().contains("0000000100000002"));
        let e = check_range(oid, 8192, u64::MAX, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
    }

    #[test]
    fn test_object_size_must_be_whole_blocks() {
        assert!(check_object_size(4 << 20).is_ok());
        assert_eq!(check_object_size(0).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(
            check_object_size(4097).unwrap_err().kind(),
            ErrorKind::Invalid
        );
    }
}
