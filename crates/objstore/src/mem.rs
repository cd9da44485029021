//! [`MemStore`]: an in-memory [`ObjectStore`] with the semantics of
//! [`FileStore`](crate::FileStore), for the tests of the layers above (replica,
//! recovery, volume, simulator). Objects are sparse maps of 4 KiB blocks; zeroing a
//! whole block drops it, as punching a hole does on disk. There are no checksums,
//! but [`MemStore::corrupt_block`] makes a block fail like a checksum mismatch.
//!
//! [`MemStore::new`] is a disk that never lies: flush is a no-op and nothing is
//! lost until the store is dropped. [`MemStore::lying`] is one that lies the way a
//! real disk and page cache do, for the simulator's faults (the `lies` module):
//! writes are durable only once flushed, and a power loss
//! ([`MemStore::power_loss`]) loses what was not, but for a random part that the
//! kernel wrote back on its own, torn at block granularity (a block whose data and
//! checksum disagree reads as corrupt); a block can read EIO
//! ([`MemStore::eio_block`]); a flush can fail and, as Linux's fsync does, forget
//! that it did ([`MemStore::fail_next_flush`]); the disk can fill up
//! ([`MemStore::set_capacity`]).
use crate::crc::BLOCK;
use crate::{check_range, ObjectStore};
use drove_types::{
    Error, ErrorKind, ObjVersion, ObjectId, Result, BLOCK_SIZE, DEFAULT_OBJECT_SIZE,
};
use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One 4 KiB block, shared: the copy of an object's durable image taken at its
/// first change since a flush ([`Lies`]) copies pointers, not the data, and a
/// write copies only the blocks it changes (`Arc::make_mut`). Profiled, that copy
/// (`MemStore::changing`) took 9 % of `drove sim faults --meta raft` with blocks of
/// their own.
pub(crate) type Block = Arc<[u8; BLOCK]>;

const BS: u64 = BLOCK_SIZE;

#[derive(Default, Clone)]
pub(crate) struct Obj {
    pub(crate) blocks: BTreeMap<u64, Block>,
    /// Blocks that read as [`ErrorKind::Corrupt`] until wholly overwritten.
    pub(crate) corrupt: BTreeSet<u64>,
    /// Blocks whose reads fail with EIO (a latent sector error) until wholly
    /// overwritten.
    pub(crate) eio: BTreeSet<u64>,
    pub(crate) version: ObjVersion,
}

/// An object store in memory, on a disk that never lies ([`MemStore::new`]) or one
/// that lies as a real one does ([`MemStore::lying`], see the module's
/// documentation).
pub struct MemStore {
    object_size: u64,
    objects: Mutex<BTreeMap<ObjectId, Obj>>,
    /// What the disk has made durable, and the faults armed on it; `None`: a disk
    /// that never loses anything ([`MemStore::new`], for tests of other layers).
    lies: Option<Mutex<crate::lies::Lies>>,
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
            lies: None,
            flush_fails: Default::default(),
            space: Mutex::new(None),
        }
    }

    /// An empty store on a disk that lies (see the module's documentation): what
    /// is not flushed can be lost ([`MemStore::power_loss`]), and the faults of the
    /// `lies` module can be armed. For the simulator.
    pub fn lying(object_size: u64) -> MemStore {
        MemStore {
            lies: Some(Mutex::new(Default::default())),
            ..MemStore::new(object_size)
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

    /// Make block `block` of `oid` read EIO (a latent sector error) until a write
    /// or zero covers the whole block. Nothing happens to a missing object.
    pub fn eio_block(&self, oid: ObjectId, block: u64) {
        if let Some(o) = self.lock().get_mut(&oid) {
            o.eio.insert(block);
        }
    }

    /// The node lost power: what was not flushed is gone, but for a random part
    /// of it ([`crate::lies`]). Returns the objects that changed.
    pub fn power_loss(&self, chance: &mut dyn FnMut(f64) -> bool) -> usize {
        let mut objects = self.lock();
        self.lies
            .as_ref()
            .map_or(0, |l| l.lock().power_loss(&mut objects, chance))
    }

    /// Make the next flush fail with EIO, forgetting the writes it should have
    /// made durable (a later flush succeeds without them), as Linux's fsync does
    /// (a store made with [`MemStore::lying`] only).
    pub fn fail_next_flush(&self) {
        if let Some(l) = &self.lies {
            l.lock().fail_next_flush = true;
        }
    }

    /// A copy of this disk as it is now, what it made durable included: the disk
    /// a restarted node finds (work the dead process still had under way does not
    /// reach it).
    pub fn copy_disk(&self) -> MemStore {
        let objects = self.lock().clone();
        MemStore {
            object_size: self.object_size,
            objects: Mutex::new(objects),
            lies: self.lies.as_ref().map(|l| Mutex::new(l.lock().clone())),
            flush_fails: Default::default(),
            space: Mutex::new(*self.space.lock()),
        }
    }

    /// Objects changed since their last flush (0 for a disk that does not lie).
    pub fn unflushed(&self) -> usize {
        self.lies.as_ref().map_or(0, |l| l.lock().unflushed())
    }

    /// Blocks stored.
    pub fn blocks_used(&self) -> u64 {
        self.lock().values().map(|o| o.blocks.len() as u64).sum()
    }

    /// Disarm the faults armed on the disk: the next flush no longer fails, the
    /// disk holds as much as it is asked to (a store made with [`MemStore::lying`]).
    pub fn disarm(&self) {
        if let Some(l) = &self.lies {
            let mut l = l.lock();
            l.fail_next_flush = false;
            l.capacity = None;
        }
    }

    /// The drive remapped its unreadable sectors: each block that read EIO now
    /// holds nothing its checksum describes (it reads as corrupt until rewritten).
    pub fn remap_bad_sectors(&self) {
        for o in self.lock().values_mut() {
            let eio = std::mem::take(&mut o.eio);
            o.corrupt.extend(eio);
        }
    }

    /// From now on every flush succeeds without making anything durable: a disk
    /// that lies outright. Only to show that the simulator's durability check
    /// catches one (a store made with [`MemStore::lying`]).
    pub fn pretend_flushes(&self) {
        if let Some(l) = &self.lies {
            l.lock().pretend = true;
        }
    }

    /// Flushes that failed so far ([`MemStore::fail_next_flush`]).
    pub fn failed_flushes(&self) -> u64 {
        self.lies.as_ref().map_or(0, |l| l.lock().failed_flushes)
    }

    /// The disk holds at most `blocks` 4 KiB blocks (`None`: no limit): a write
    /// that needs more fails with `NoSpace` (a store made with
    /// [`MemStore::lying`] only).
    pub fn set_capacity(&self, blocks: Option<u64>) {
        if let Some(l) = &self.lies {
            l.lock().capacity = blocks;
        }
    }

    /// Before a change to `oid`: remember its durable state (the first change
    /// since its last flush), and refuse when the disk is full and `new_blocks`
    /// more would not fit.
    fn changing(
        &self,
        objects: &BTreeMap<ObjectId, Obj>,
        oid: ObjectId,
        new_blocks: u64,
    ) -> Result<()> {
        let Some(lies) = &self.lies else {
            return Ok(());
        };
        let mut lies = lies.lock();
        if let Some(cap) = lies.capacity {
            let used: u64 = objects.values().map(|o| o.blocks.len() as u64).sum();
            if new_blocks > 0 && used + new_blocks > cap {
                return Err(Error::new(
                    ErrorKind::NoSpace,
                    format!(
                        "object {oid}: write: no space left on device (injected: {cap} blocks)"
                    ),
                ));
            }
        }
        lies.changing(oid, objects.get(&oid));
        Ok(())
    }
}

/// Blocks `first..=last` touched by `[offset, offset + len)`, `len > 0`.
fn blocks(offset: u64, len: u64) -> (u64, u64) {
    (offset / BS, (offset + len - 1) / BS)
}

/// A latent sector error, as a FileStore reports it (the errno a
/// [`GuardedStore`](crate::GuardedStore) judges the disk failed by).
fn eio(oid: ObjectId, block: u64) -> Error {
    Error::io(
        format!("object {oid} block {block}: read (injected)"),
        std::io::Error::from_raw_os_error(libc::EIO),
    )
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
        if let Some(b) = obj.eio.range(first..=last).next() {
            return Err(eio(oid, *b));
        }
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
        if objects.get(&oid).is_some_and(|o| o.eio.contains(&block)) {
            return Err(eio(oid, block));
        }
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
        let (first, last) = blocks(offset, len);
        let new_blocks = match objects.get(&oid) {
            Some(o) => (first..=last).filter(|b| !o.blocks.contains_key(b)).count() as u64,
            None => last - first + 1,
        };
        if let Some(o) = objects.get(&oid) {
            check_partial(oid, o, offset, len)?;
        }
        self.changing(&objects, oid, new_blocks)?;
        if let Some(l) = &self.lies {
            l.lock().rewritten(oid, first..=last);
        }
        let obj = objects.entry(oid).or_default();
        let end = offset + len;
        for b in first..=last {
            let (s, e) = (offset.max(b * BS), end.min((b + 1) * BS));
            let block = Arc::make_mut(
                obj.blocks
                    .entry(b)
                    .or_insert_with(|| Arc::new([0u8; BLOCK])),
            );
            block[(s - b * BS) as usize..(e - b * BS) as usize]
                .copy_from_slice(&data[(s - offset) as usize..(e - offset) as usize]);
            obj.corrupt.remove(&b);
            if e - s == BS {
                obj.eio.remove(&b);
            }
        }
        Ok(())
    }

    fn create(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<()> {
        check_range(oid, self.object_size, 0, data.len() as u64)?;
        self.put_whole(oid, data, version, true)
    }

    fn replace(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<u64> {
        check_range(oid, self.object_size, 0, data.len() as u64)?;
        // Not atomic on disk: a power loss before the next flush can leave part.
        self.put_whole(oid, data, version, false)?;
        let stored = data.chunks(BLOCK).filter(|c| c.iter().any(|&x| x != 0));
        Ok(stored.map(|c| c.len() as u64).sum())
    }

    fn write_zeroes(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()> {
        check_range(oid, self.object_size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let mut objects = self.lock();
        match objects.get(&oid) {
            Some(o) => check_partial(oid, o, offset, len)?,
            None => return Ok(()),
        }
        self.changing(&objects, oid, 0)?;
        let (first, last) = blocks(offset, len);
        if let Some(l) = &self.lies {
            l.lock().rewritten(oid, first..=last);
        }
        let Some(obj) = objects.get_mut(&oid) else {
            return Ok(());
        };
        let end = offset + len;
        for b in first..=last {
            let (s, e) = (offset.max(b * BS), end.min((b + 1) * BS));
            if e - s == BS {
                obj.blocks.remove(&b);
                obj.corrupt.remove(&b);
                obj.eio.remove(&b);
            } else if let Some(block) = obj.blocks.get_mut(&b) {
                Arc::make_mut(block)[(s - b * BS) as usize..(e - b * BS) as usize].fill(0);
            }
        }
        Ok(())
    }

    fn flush(&self, oids: &[ObjectId]) -> Result<()> {
        if self.flush_fails.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Io, "flush failed (injected fault)"));
        }
        let objects = self.lock();
        match &self.lies {
            Some(l) => l.lock().flush(&objects, oids),
            None => Ok(()),
        }
    }

    fn version(&self, oid: ObjectId) -> Result<ObjVersion> {
        Ok(self.lock().get(&oid).map(|o| o.version).unwrap_or_default())
    }

    fn set_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        let mut objects = self.lock();
        if objects.get(&oid).is_some_and(|o| o.version != version) {
            self.changing(&objects, oid, 0)?;
        }
        if let Some(o) = objects.get_mut(&oid) {
            o.version = version;
        }
        Ok(())
    }

    fn raise_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        let mut objects = self.lock();
        if objects.get(&oid).is_some_and(|o| o.version < version) {
            self.changing(&objects, oid, 0)?;
        }
        if let Some(o) = objects.get_mut(&oid) {
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
        let mut objects = self.lock();
        if objects.contains_key(&oid) {
            self.changing(&objects, oid, 0)?;
            objects.remove(&oid);
        }
        Ok(())
    }

    fn disk_space(&self) -> Option<crate::DiskSpace> {
        let cap = self.lies.as_ref().and_then(|l| l.lock().capacity);
        match cap {
            Some(blocks) => {
                let used = self.used_bytes().unwrap_or(0);
                let size = blocks * BS;
                Some(crate::DiskSpace {
                    size,
                    free: size.saturating_sub(used),
                })
            }
            None => *self.space.lock(),
        }
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

impl MemStore {
    /// Replace `oid` by `data` with `version`; `atomic`: a power loss before the
    /// next flush leaves it whole or as it was (a create), else possibly part.
    fn put_whole(
        &self,
        oid: ObjectId,
        data: &[u8],
        version: ObjVersion,
        atomic: bool,
    ) -> Result<()> {
        check_range(oid, self.object_size, 0, data.len() as u64)?;
        let mut obj = Obj {
            version,
            ..Obj::default()
        };
        for (b, chunk) in data.chunks(BLOCK).enumerate() {
            if chunk.iter().any(|&x| x != 0) {
                let mut block = [0u8; BLOCK];
                block[..chunk.len()].copy_from_slice(chunk);
                obj.blocks.insert(b as u64, Arc::new(block));
            }
        }
        let mut objects = self.lock();
        let had = objects.get(&oid).map_or(0, |o| o.blocks.len() as u64);
        self.changing(&objects, oid, (obj.blocks.len() as u64).saturating_sub(had))?;
        if let Some(l) = &self.lies {
            let mut lies = l.lock();
            lies.rewritten(oid, 0..=u64::MAX);
            if atomic {
                lies.atomic(oid);
            }
        }
        objects.insert(oid, obj);
        Ok(())
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

    fn seq(seed: u64) -> impl FnMut(f64) -> bool {
        let mut x = seed;
        move |p| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 11) as f64 / (1u64 << 53) as f64) < p
        }
    }

    #[test]
    fn test_a_power_loss_keeps_what_was_flushed_and_maybe_part_of_the_rest() {
        let oid = ObjectId::new(VdiId(1), 0);
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..300 {
            let s = MemStore::lying(1 << 20);
            s.write(oid, 0, &[1u8; 8192]).unwrap();
            s.flush(&[oid]).unwrap();
            s.write(oid, 0, &[2u8; 8192]).unwrap();
            s.power_loss(&mut seq(seed));
            // Each block holds the flushed write or the later one, or reads as
            // torn: never anything else.
            let mut o = Vec::new();
            for b in 0..2u64 {
                o.push(match s.read(oid, b * 4096, 4096) {
                    Ok(d) if d == vec![1u8; 4096] => 1,
                    Ok(d) if d == vec![2u8; 4096] => 2,
                    Ok(d) => panic!("block {b} holds {:?}", &d[..4]),
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::Corrupt);
                        0
                    }
                });
            }
            outcomes.insert(o);
        }
        for o in [vec![1, 1], vec![2, 2], vec![1, 2], vec![2, 1]] {
            assert!(outcomes.contains(&o), "{o:?} never seen: {outcomes:?}");
        }
        assert!(outcomes.iter().any(|o| o.contains(&0)), "no torn block");
        // Flushed, nothing is lost.
        let s = MemStore::lying(1 << 20);
        s.write(oid, 0, &[3u8; 4096]).unwrap();
        s.flush(&[]).unwrap();
        s.power_loss(&mut seq(1));
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![3u8; 4096]);
        // A store that does not lie loses nothing.
        let s = MemStore::new(1 << 20);
        s.write(oid, 0, &[4u8; 4096]).unwrap();
        s.power_loss(&mut seq(1));
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![4u8; 4096]);
    }

    #[test]
    fn test_a_failed_flush_forgets_its_writes_even_after_a_later_flush() {
        let oid = ObjectId::new(VdiId(1), 0);
        let s = MemStore::lying(1 << 20);
        s.write(oid, 0, &[1u8; 4096]).unwrap();
        s.flush(&[]).unwrap();
        s.write(oid, 0, &[2u8; 4096]).unwrap();
        s.fail_next_flush();
        assert_eq!(s.flush(&[oid]).unwrap_err().kind(), ErrorKind::Io);
        s.flush(&[oid]).unwrap();
        assert_eq!(s.failed_flushes(), 1);
        // Block 1 written after the failure is dirty anew: a flush keeps it.
        s.write(oid, 4096, &[5u8; 4096]).unwrap();
        s.flush(&[oid]).unwrap();
        s.power_loss(&mut |_| false);
        assert_eq!(s.read(oid, 0, 4096).unwrap(), vec![1u8; 4096], "the lie");
        assert_eq!(s.read(oid, 4096, 4096).unwrap(), vec![5u8; 4096]);
    }

    #[test]
    fn test_latent_errors_and_a_full_disk() {
        let oid = ObjectId::new(VdiId(1), 0);
        let s = MemStore::lying(1 << 20);
        s.write(oid, 0, &[1u8; 8192]).unwrap();
        s.eio_block(oid, 1);
        assert_eq!(s.read(oid, 4096, 10).unwrap_err().kind(), ErrorKind::Io);
        assert_eq!(s.read(oid, 0, 10).unwrap(), vec![1u8; 10]);
        s.write(oid, 4096, &[2u8; 4096]).unwrap();
        assert_eq!(s.read(oid, 4096, 10).unwrap(), vec![2u8; 10]);
        s.set_capacity(Some(3));
        s.write(oid, 8192, &[3u8; 4096]).unwrap();
        let e = s.write(oid, 3 * 4096, &[4u8; 4096]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        // Overwrites need no space.
        s.write(oid, 0, &[6u8; 8192]).unwrap();
    }
}
