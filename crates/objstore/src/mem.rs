//! [`MemStore`]: an in-memory [`ObjectStore`] with the semantics of
//! [`FileStore`](crate::FileStore), for the tests of the layers above (replica,
//! recovery, volume, simulator). Objects are sparse maps of 4 KiB blocks; zeroing a
//! whole block drops it, as punching a hole does on disk. There are no checksums,
//! but [`MemStore::corrupt_block`] makes a block fail like a checksum mismatch.
use crate::crc::BLOCK;
use crate::{check_range, ObjectStore};
use drove_types::{
    Error, ErrorKind, ObjVersion, ObjectId, Result, BLOCK_SIZE, DEFAULT_OBJECT_SIZE,
};
use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet};

const BS: u64 = BLOCK_SIZE;

#[derive(Default)]
struct Obj {
    blocks: BTreeMap<u64, Box<[u8; BLOCK]>>,
    /// Blocks that read as [`ErrorKind::Corrupt`] until wholly overwritten.
    corrupt: BTreeSet<u64>,
    version: ObjVersion,
}

/// An object store in memory. Flush is a no-op: nothing is lost until it is dropped.
pub struct MemStore {
    object_size: u64,
    objects: Mutex<BTreeMap<ObjectId, Obj>>,
    /// Flushes fail with an I/O error while set ([`MemStore::fail_flushes`]).
    flush_fails: std::sync::atomic::AtomicBool,
    /// What [`ObjectStore::disk_space`] answers ([`MemStore::set_disk_space`]).
    space: Mutex<Option<crate::DiskSpace>>,
}

impl Default for MemStore {
    /// A store of 4 MiB objects.
    fn default() -> Self {
        MemStore::new(u64::from(DEFAULT_OBJECT_SIZE))
    }
}

impl MemStore {
    /// An empty store for objects of at most `object_size` bytes.
    pub fn new(object_size: u64) -> MemStore {
        MemStore {
            object_size,
            objects: Mutex::new(BTreeMap::new()),
            flush_fails: Default::default(),
            space: Mutex::new(None),
        }
    }

    /// Make [`ObjectStore::disk_space`] answer `space`, as if the store sat on a
    /// disk that size and that full. For fault tests (a full disk).
    pub fn set_disk_space(&self, space: Option<crate::DiskSpace>) {
        *self.space.lock() = space;
    }

    /// While `fail` is set, every flush fails with an I/O error, as an fsync on a
    /// failing disk does. For fault tests.
    pub fn fail_flushes(&self, fail: bool) {
        self.flush_fails
            .store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    /// Make block `block` (4 KiB units) of `oid` fail reads and partial writes with
    /// `Corrupt`, as a checksum mismatch does in a `FileStore`, until a write or zero
    /// covers the whole block. Creates the object if missing. For fault tests.
    pub fn corrupt_block(&self, oid: ObjectId, block: u64) {
        self.lock().entry(oid).or_default().corrupt.insert(block);
    }

    /// The blocks [`MemStore::corrupt_block`] made fail and no write has covered
    /// since, in order.
    pub fn corrupt_blocks(&self) -> Vec<(ObjectId, u64)> {
        self.lock()
            .iter()
            .flat_map(|(oid, o)| o.corrupt.iter().map(move |b| (*oid, *b)))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<ObjectId, Obj>> {
        self.objects.lock()
    }
}

/// Blocks `first..=last` touched by `[offset, offset + len)`, `len > 0`.
fn blocks(offset: u64, len: u64) -> (u64, u64) {
    (offset / BS, (offset + len - 1) / BS)
}

fn corrupt(oid: ObjectId, block: u64) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("object {oid} block {block}: checksum mismatch (injected)"),
    )
}

/// Fail if a block that `[offset, offset + len)` covers only partly is corrupt
/// (a read-modify-write of it would fail on disk).
fn check_partial(oid: ObjectId, obj: &Obj, offset: u64, len: u64) -> Result<()> {
    let (first, last) = blocks(offset, len);
    for b in [first, last] {
        let whole = offset <= b * BS && (b + 1) * BS <= offset + len;
        if !whole && obj.corrupt.contains(&b) {
            return Err(corrupt(oid, b));
        }
    }
    Ok(())
}

impl ObjectStore for MemStore {
    fn never_blocks(&self) -> bool {
        true
    }

    fn read(&self, oid: ObjectId, offset: u64, len: u32) -> Result<Vec<u8>> {
        check_range(oid, self.object_size, offset, u64::from(len))?;
        let mut out = vec![0u8; len as usize];
        if len == 0 {
            return Ok(out);
        }
        let objects = self.lock();
        let Some(obj) = objects.get(&oid) else {
            return Ok(out);
        };
        let (first, last) = blocks(offset, u64::from(len));
        if let Some(b) = obj.corrupt.range(first..=last).next() {
            return Err(corrupt(oid, *b));
        }
        let end = offset + u64::from(len);
        for (b, data) in obj.blocks.range(first..=last) {
            let (s, e) = (offset.max(b * BS), end.min((b + 1) * BS));
            out[(s - offset) as usize..(e - offset) as usize]
                .copy_from_slice(&data[(s - b * BS) as usize..(e - b * BS) as usize]);
        }
        Ok(out)
    }

    fn read_unverified(&self, oid: ObjectId, block: u64) -> Result<Vec<u8>> {
        check_range(oid, self.object_size, block.saturating_mul(BS), BS)?;
        let objects = self.lock();
        let data = objects.get(&oid).and_then(|o| o.blocks.get(&block));
        Ok(data.map_or_else(|| vec![0u8; BS as usize], |d| d.to_vec()))
    }

    fn write(&self, oid: ObjectId, offset: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        check_range(oid, self.object_size, offset, len)?;
        if data.is_empty() {
            return Ok(());
        }
        let mut objects = self.lock();
        let obj = objects.entry(oid).or_default();
        check_partial(oid, obj, offset, len)?;
        let (first, last) = blocks(offset, len);
        let end = offset + len;
        for b in first..=last {
            let (s, e) = (offset.max(b * BS), end.min((b + 1) * BS));
            let block = obj
                .blocks
                .entry(b)
                .or_insert_with(|| Box::new([0u8; BLOCK]));
            block[(s - b * BS) as usize..(e - b * BS) as usize]
                .copy_from_slice(&data[(s - offset) as usize..(e - offset) as usize]);
            obj.corrupt.remove(&b);
        }
        Ok(())
    }

    fn create(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<()> {
        check_range(oid, self.object_size, 0, data.len() as u64)?;
        let mut obj = Obj {
            version,
            ..Obj::default()
        };
        for (b, chunk) in data.chunks(BLOCK).enumerate() {
            if chunk.iter().any(|&x| x != 0) {
                let mut block = Box::new([0u8; BLOCK]);
                block[..chunk.len()].copy_from_slice(chunk);
                obj.blocks.insert(b as u64, block);
            }
        }
        self.lock().insert(oid, obj);
        Ok(())
    }

    fn replace(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<u64> {
        // In memory, the atomic replace is also the fast one.
        self.create(oid, data, version)?;
        let stored = data.chunks(BLOCK).filter(|c| c.iter().any(|&x| x != 0));
        Ok(stored.map(|c| c.len() as u64).sum())
    }

    fn write_zeroes(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()> {
        check_range(oid, self.object_size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let mut objects = self.lock();
        let Some(obj) = objects.get_mut(&oid) else {
            return Ok(());
        };
        check_partial(oid, obj, offset, len)?;
        let (first, last) = blocks(offset, len);
        let end = offset + len;
        for b in first..=last {
            let (s, e) = (offset.max(b * BS), end.min((b + 1) * BS));
            if e - s == BS {
                obj.blocks.remove(&b);
                obj.corrupt.remove(&b);
            } else if let Some(block) = obj.blocks.get_mut(&b) {
                block[(s - b * BS) as usize..(e - b * BS) as usize].fill(0);
            }
        }
        Ok(())
    }

    fn flush(&self, _oids: &[ObjectId]) -> Result<()> {
        if self.flush_fails.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Io, "flush failed (injected fault)"));
        }
        Ok(())
    }

    fn version(&self, oid: ObjectId) -> Result<ObjVersion> {
        Ok(self.lock().get(&oid).map(|o| o.version).unwrap_or_default())
    }

    fn set_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        if let Some(o) = self.lock().get_mut(&oid) {
            o.version = version;
        }
        Ok(())
    }

    fn raise_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        if let Some(o) = self.lock().get_mut(&oid) {
            o.version = o.version.max(version);
        }
        Ok(())
    }

    /// From the blocks as written, whatever [`MemStore::corrupt_block`] marked: a
    /// file store's checksums still describe the data a flip damaged.
    fn content_crc(&self, oid: ObjectId, len: u32) -> Result<u32> {
        check_range(oid, self.object_size, 0, u64::from(len))?;
        let objects = self.lock();
        let Some(obj) = objects.get(&oid) else {
            return Ok(crate::zeros_content_crc(len));
        };
        let n = u64::from(len).div_ceil(BLOCK as u64);
        let mut entries = vec![0u8; n as usize * crate::crc::CRC_LEN];
        for (b, data) in obj.blocks.range(..n) {
            crate::crc::set_entry(&mut entries, *b as usize, crate::crc::stored_crc(&data[..]));
        }
        Ok(crate::crc::digest_entries(&entries))
    }

    fn exists(&self, oid: ObjectId) -> Result<bool> {
        Ok(self.lock().contains_key(&oid))
    }

    fn delete(&self, oid: ObjectId) -> Result<()> {
        self.lock().remove(&oid);
        Ok(())
    }

    fn disk_space(&self) -> Option<crate::DiskSpace> {
        *self.space.lock()
    }

    fn usage(&self) -> Result<BTreeMap<drove_types::VdiId, crate::Usage>> {
        let mut out: BTreeMap<_, crate::Usage> = BTreeMap::new();
        for (oid, obj) in self.lock().iter() {
            let u = out.entry(oid.vdi).or_default();
            u.objects += 1;
            u.bytes += obj.blocks.len() as u64 * BS;
        }
        Ok(out)
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        Ok(self.lock().keys().copied().collect())
    }

    fn used_bytes(&self) -> Result<u64> {
        Ok(self
            .lock()
            .values()
            .map(|o| o.blocks.len() as u64 * BS)
            .sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::VdiId;

    #[test]
    fn test_injected_corruption_fails_reads_until_overwritten() {
        let s = MemStore::default();
        let oid = ObjectId::new(VdiId(1), 0);
        s.write(oid, 0, &[7u8; 8192]).unwrap();
        s.corrupt_block(oid, 1);
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![7u8; 4096]);
        let e = s.read(oid, 4000, 200).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.message().contains("block 1"));
        // A partial write cannot repair it; a whole-block write does.
        assert_eq!(
            s.write(oid, 4096, &[1]).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        s.write(oid, 4096, &[9u8; 4096]).unwrap();
        assert_eq!(s.read(oid, 4096, 4096).unwrap(), vec![9u8; 4096]);
    }

    #[test]
    fn test_zeroing_whole_blocks_frees_them() {
        let s = MemStore::new(1 << 20);
        let oid = ObjectId::new(VdiId(1), 0);
        s.write(oid, 0, &[1u8; 3 * 4096]).unwrap();
        assert_eq!(s.used_bytes().unwrap(), 3 * 4096);
        s.write_zeroes(oid, 100, 2 * 4096).unwrap();
        assert_eq!(s.used_bytes().unwrap(), 2 * 4096);
        let got = s.read(oid, 0, 3 * 4096).unwrap();
        assert!(got[..100].iter().all(|b| *b == 1));
        assert!(got[100..100 + 2 * 4096].iter().all(|b| *b == 0));
        assert!(got[100 + 2 * 4096..].iter().all(|b| *b == 1));
    }
}
