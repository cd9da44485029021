//! One open object of a [`FileStore`](crate::FileStore): its data and checksum files,
//! its block-range locks and its sync state, and the block-level read, write and
//! zero that keep every 4 KiB block and its stored crc32c in step.
//!
//! Hot path: an aligned 4 KiB write computes one crc and does two `pwrite`s (data,
//! then its checksum); an aligned 4 KiB read does two `pread`s into the result
//! buffer and a stack array. Only a partial block is read before it is written.
use crate::crc::{self, BLOCK, CRC_LEN};
use crate::layout::Layout;
use crate::stripes::Stripes;
use crate::sys;
use drove_types::{Error, ObjVersion, ObjectId, Result, BLOCK_SIZE};
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

const BS: u64 = BLOCK_SIZE;

/// Blocks whose checksums are handled as one batch: 4 MiB of data, whose 4 KiB of
/// checksums fit in a stack array. Larger I/Os loop over batches.
const CHUNK_BLOCKS: u64 = 1024;
const CHUNK_CRC_BYTES: usize = CHUNK_BLOCKS as usize * CRC_LEN;

/// Bytes written to an object's page cache after which their write-back is started
/// (RocksDB's `bytes_per_sync`). Without it, a VM copying gigabytes fills the page
/// cache with dirty data that the kernel writes back late and all at once, and every
/// fsync on the disk meanwhile (the metadata's Raft log among them) waits behind it:
/// measured here, 2.4 s median for a 300-byte fsync beside 8 buffered writers, 0.3 s
/// with early write-back. Raft appends that slow time out, and write-lock leases
/// that cannot be renewed fail the VM's writes.
pub(crate) const WRITEBACK_AFTER: u64 = 1 << 20;

/// An object's open files and per-object state. There is at most one `ObjFile` per
/// object in a store at a time (the fd cache guarantees it), so its locks are the
/// object's locks.
pub(crate) struct ObjFile {
    oid: ObjectId,
    data: File,
    crc: File,
    stripes: Stripes,
    /// Bumped after each write or zero has reached the page cache.
    write_seq: AtomicU64,
    /// The `write_seq` that the last successful sync covered. Held across the
    /// fdatasyncs so that a second flush of the object waits for a sync in progress
    /// instead of returning before it is done.
    synced_seq: Mutex<u64>,
    /// Whether the object is in the store's dirty set (see `dirty`).
    pub(crate) in_dirty: AtomicBool,
    /// Set once the object is deleted; writes still in flight on this handle go to
    /// the unlinked file and must not re-enter the dirty set.
    pub(crate) deleted: AtomicBool,
    /// Recency for the fd cache's eviction.
    pub(crate) last_used: AtomicU64,
    /// Bytes written since the object's write-back was last started.
    unstarted: AtomicU64,
    /// Offset of the version record in the checksum file.
    version_at: u64,
    /// The stored version, once read (so that setting an unchanged one, the case
    /// of every write but a writer's first to the object in an epoch, is free).
    version: Mutex<Option<ObjVersion>>,
}

/// Bytes of the version record: generation and epoch (u64 LE each), then the
/// crc32c of those 16 bytes. A record that does not verify (never written, torn)
/// reads as version zero.
const VERSION_LEN: usize = 20;

fn encode_version(v: ObjVersion) -> [u8; VERSION_LEN] {
    let mut b = [0u8; VERSION_LEN];
    b[..8].copy_from_slice(&v.generation.to_le_bytes());
    b[8..16].copy_from_slice(&v.epoch.to_le_bytes());
    let crc = crc32c::crc32c(&b[..16]);
    b[16..].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode_version(b: &[u8; VERSION_LEN]) -> ObjVersion {
    let word = |r: std::ops::Range<usize>| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[r]);
        u64::from_le_bytes(w)
    };
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&b[16..]);
    if crc32c::crc32c(&b[..16]) != u32::from_le_bytes(crc) {
        return ObjVersion::default();
    }
    ObjVersion {
        generation: word(0..8),
        epoch: word(8..16),
    }
}

impl ObjFile {
    /// Open the files of `oid`; if it does not exist, create it when `create`, else
    /// return `None`.
    pub(crate) fn open(layout: &Layout, oid: ObjectId, create: bool) -> Result<Option<ObjFile>> {
        let data_path = layout.data_path(oid);
        let crc_path = layout.crc_path(oid);
        match open_rw(&data_path, false, false) {
            Ok(data) => {
                // Created with the data file; `create` only covers a checksum file
                // lost some other way, whose written blocks will then fail to verify.
                let crc = open_rw(&crc_path, true, false)
                    .map_err(|e| Error::io(format!("object {oid}: open checksums"), e))?;
                return Ok(Some(ObjFile::new(oid, data, crc, layout.version_at())));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("object {oid}: open"), e)),
        }
        if !create {
            return Ok(None);
        }
        layout.ensure_dirs(oid)?;
        // The checksum file comes first and is emptied: the data file's existence is
        // what makes the object exist, and a crash in the middle of a delete (data
        // unlinked, checksums not yet) can have left stale checksums behind.
        let crc = open_rw(&crc_path, true, true)
            .map_err(|e| Error::io(format!("object {oid}: create checksums"), e))?;
        let data = open_rw(&data_path, true, false)
            .map_err(|e| Error::io(format!("object {oid}: create"), e))?;
        layout.mark_object_dir_dirty(oid);
        Ok(Some(ObjFile::new(oid, data, crc, layout.version_at())))
    }

    /// Write a whole object into new files at `data_path` and `crc_path` (temporary
    /// names the caller renames into place) and make them durable. Runs of non-zero
    /// blocks are written; zero blocks stay holes, whose stored checksum (0) verifies.
    /// The object's version is `version`.
    pub(crate) fn write_new(
        layout: &Layout,
        oid: ObjectId,
        (data_path, crc_path): (&Path, &Path),
        content: &[u8],
        version: ObjVersion,
    ) -> Result<()> {
        let open = |p: &Path| {
            open_rw(p, true, true)
                .map_err(|e| Error::io(format!("object {oid}: create {}", p.display()), e))
        };
        let f = ObjFile::new(oid, open(data_path)?, open(crc_path)?, layout.version_at());
        f.set_version(version)?;
        f.write_runs(content, None)?;
        f.data.sync_data().map_err(|e| f.io_err("fsync", e))?;
        f.crc
            .sync_data()
            .map_err(|e| f.io_err("fsync checksums", e))
    }

    fn new(oid: ObjectId, data: File, crc: File, version_at: u64) -> ObjFile {
        ObjFile {
            version_at,
            version: Mutex::new(None),
            oid,
            data,
            crc,
            stripes: Stripes::new(),
            write_seq: AtomicU64::new(0),
            synced_seq: Mutex::new(0),
            in_dirty: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            last_used: AtomicU64::new(0),
            unstarted: AtomicU64::new(0),
        }
    }

    /// The object this handle is for.
    pub(crate) fn oid(&self) -> ObjectId {
        self.oid
    }

    fn io_err(&self, what: &str, e: io::Error) -> Error {
        Error::io(format!("object {}: {what}", self.oid), e)
    }

    /// The object's version (zero if never set or unreadable).
    pub(crate) fn version(&self) -> Result<ObjVersion> {
        let mut cached = self.version.lock();
        self.stored_version(&mut cached)
    }

    /// The cached version, read from the checksum file the first time.
    fn stored_version(&self, cached: &mut Option<ObjVersion>) -> Result<ObjVersion> {
        if let Some(v) = *cached {
            return Ok(v);
        }
        let mut b = [0u8; VERSION_LEN];
        let v = match self.crc.read_exact_at(&mut b, self.version_at) {
            Ok(()) => decode_version(&b),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => ObjVersion::default(),
            Err(e) => return Err(self.io_err("read version", e)),
        };
        *cached = Some(v);
        Ok(v)
    }

    /// Record the object's version, durable with the next sync. The comparison and
    /// the write happen under one lock, so concurrent setters cannot interleave.
    pub(crate) fn set_version(&self, v: ObjVersion) -> Result<()> {
        self.put_version(v, |stored| stored == v)
    }

    /// Raise the stored version to `v` unless it is that or later (a write's).
    pub(crate) fn raise_version(&self, v: ObjVersion) -> Result<()> {
        self.put_version(v, |stored| stored >= v)
    }

    /// Store version `v` unless `keep` says the stored one stays, under the
    /// version's lock (concurrent writers compare and set one at a time).
    fn put_version(&self, v: ObjVersion, keep: impl Fn(ObjVersion) -> bool) -> Result<()> {
        let mut cached = self.version.lock();
        if keep(self.stored_version(&mut cached)?) {
            return Ok(());
        }
        self.crc
            .write_all_at(&encode_version(v), self.version_at)
            .map_err(|e| self.io_err("write version", e))?;
        *cached = Some(v);
        self.write_seq.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Read `len` bytes at `offset` (range already checked), verifying every block.
    pub(crate) fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let end = offset + u64::from(len);
        let (first, last) = (offset / BS, (end - 1) / BS);
        let start = first * BS;
        // Whole blocks are read into the result buffer so each can be verified;
        // the unaligned head is shifted out afterwards (no second buffer).
        let span = usize::try_from((last - first + 1) * BS)
            .map_err(|_| Error::invalid(format!("object {}: read too large", self.oid)))?;
        let mut buf = {
            let _locks = self.stripes.read(first, last);
            let buf =
                sys::read_new_at(&self.data, span, start).map_err(|e| self.io_err("read", e))?;
            self.verify_blocks(first, &buf)?;
            buf
        };
        let head = (offset - start) as usize;
        let len = len as usize;
        if head > 0 {
            buf.copy_within(head..head + len, 0);
        }
        buf.truncate(len);
        Ok(buf)
    }

    /// Block `b` as it lies in the data file, not checked against its checksum
    /// (range already checked).
    pub(crate) fn read_unverified(&self, b: u64) -> Result<Vec<u8>> {
        let _locks = self.stripes.read(b, b);
        sys::read_new_at(&self.data, BLOCK, b * BS).map_err(|e| self.io_err("read", e))
    }

    /// The content digest of the first `len` bytes from the stored checksums
    /// alone (4 bytes read per 4 KiB block; see [`crate::content_crc`]).
    pub(crate) fn content_crc(&self, len: u32) -> Result<u32> {
        let blocks = u64::from(len).div_ceil(BS);
        if blocks == 0 {
            return Ok(crc::digest_entries(&[]));
        }
        let n = usize::try_from(blocks)
            .map_err(|_| Error::invalid(format!("object {}: digest too large", self.oid)))?
            * CRC_LEN;
        let _locks = self.stripes.read(0, blocks - 1);
        let entries =
            sys::read_new_at(&self.crc, n, 0).map_err(|e| self.io_err("read checksums", e))?;
        Ok(crc::digest_entries(&entries))
    }

    /// Check whole blocks `buf`, the first being block `first`, against their
    /// stored checksums.
    fn verify_blocks(&self, first: u64, buf: &[u8]) -> Result<()> {
        let mut crcs = [0u8; CHUNK_CRC_BYTES];
        for (c, chunk) in buf.chunks(CHUNK_BLOCKS as usize * BLOCK).enumerate() {
            let b0 = first + c as u64 * CHUNK_BLOCKS;
            let crcs = &mut crcs[..chunk.len() / BLOCK * CRC_LEN];
            sys::read_full_at(&self.crc, crcs, b0 * CRC_LEN as u64)
                .map_err(|e| self.io_err("read checksums", e))?;
            for (i, block) in chunk.chunks_exact(BLOCK).enumerate() {
                crc::verify(self.oid, b0 + i as u64, block, crc::entry(crcs, i))?;
            }
        }
        Ok(())
    }

    /// Read block `b` into `out` and verify it (for read-modify-write).
    fn read_block(&self, b: u64, out: &mut [u8; BLOCK]) -> Result<()> {
        sys::read_full_at(&self.data, out, b * BS).map_err(|e| self.io_err("read", e))?;
        let mut stored = [0u8; CRC_LEN];
        sys::read_full_at(&self.crc, &mut stored, b * CRC_LEN as u64)
            .map_err(|e| self.io_err("read checksums", e))?;
        crc::verify(self.oid, b, out, crc::entry(&stored, 0))
    }

    /// Whether a write of `len` bytes at `offset` needs new blocks: a data block or
    /// a checksum block not allocated yet, or (`versioned`: the write sets the
    /// version) the version record.
    pub(crate) fn needs_space(&self, offset: u64, len: u64, versioned: bool) -> io::Result<bool> {
        if len == 0 {
            return Ok(false);
        }
        let (first, last) = (offset / BS, (offset + len - 1) / BS);
        let crc_at = first * CRC_LEN as u64;
        let crc_len = (last - first + 1) * CRC_LEN as u64;
        let version_there =
            !versioned || sys::allocated(&self.crc, self.version_at, VERSION_LEN as u64)?;
        Ok(!(sys::allocated(&self.data, offset, len)?
            && sys::allocated(&self.crc, crc_at, crc_len)?
            && version_there))
    }

    /// Write `data` at `offset` (range already checked).
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let res = self.write_blocks(offset, data);
        // Counted even when it failed part-way: some of it may be in the page cache.
        self.write_seq.fetch_add(1, SeqCst);
        res
    }

    fn write_blocks(&self, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BS, (end - 1) / BS);
        let _locks = self.stripes.write(first, last);
        let mut b = first;
        while b <= last {
            let chunk_last = last.min(b + CHUNK_BLOCKS - 1);
            // The part of `data` that falls in blocks b..=chunk_last.
            let lo = offset.max(b * BS);
            let hi = end.min((chunk_last + 1) * BS);
            let piece = &data[(lo - offset) as usize..(hi - offset) as usize];
            let mut crcs = [0u8; CHUNK_CRC_BYTES];
            for blk in b..=chunk_last {
                let (bs, be) = (blk * BS, (blk + 1) * BS);
                let crc = if lo <= bs && be <= hi {
                    crc::stored_crc(&piece[(bs - lo) as usize..(be - lo) as usize])
                } else {
                    // A partial block: its checksum covers bytes this write keeps.
                    let mut merged = [0u8; BLOCK];
                    self.read_block(blk, &mut merged)?;
                    let (s, e) = (lo.max(bs), hi.min(be));
                    merged[(s - bs) as usize..(e - bs) as usize]
                        .copy_from_slice(&piece[(s - lo) as usize..(e - lo) as usize]);
                    crc::stored_crc(&merged)
                };
                crc::set_entry(&mut crcs, (blk - b) as usize, crc);
            }
            // Data first, then checksums. A crash in between leaves blocks that fail
            // verification (repaired from another replica); no order of two files
            // avoids that without a journal, and this one never makes stale data
            // verify as new.
            self.data
                .write_all_at(piece, lo)
                .map_err(|e| self.io_err("write", e))?;
            let n = (chunk_last - b + 1) as usize;
            self.crc
                .write_all_at(&crcs[..n * CRC_LEN], b * CRC_LEN as u64)
                .map_err(|e| self.io_err("write checksums", e))?;
            b = chunk_last + 1;
        }
        Ok(())
    }

    /// Write `content` from the start of an object that has no data yet: runs of
    /// non-zero blocks are written, zero blocks stay holes (whose stored checksum,
    /// 0, verifies). Returns the bytes written. With `direct` (an O_DIRECT
    /// descriptor of the data file) and `content` aligned for it, the data goes to
    /// the disk without a copy into the page cache: recovery writes whole objects
    /// that no one is about to read here, and that copy was the largest kernel cost
    /// of a recovery pass. A run the disk refuses that way is written normally.
    pub(crate) fn write_runs(&self, content: &[u8], direct: Option<&File>) -> Result<u64> {
        let direct = direct.filter(|_| sys::direct_ok(content));
        let bs = BS as usize;
        let mut written = 0u64;
        let mut put = |s: usize, e: usize| -> Result<()> {
            let run = &content[s * bs..(e * bs).min(content.len())];
            written += run.len() as u64;
            match direct {
                Some(d) => self.write_direct(d, (s * bs) as u64, run),
                None => self.write((s * bs) as u64, run),
            }
        };
        let mut start = None;
        for (i, block) in content.chunks(bs).enumerate() {
            let zero = block.iter().all(|&b| b == 0);
            match (zero, start) {
                (false, None) => start = Some(i),
                (true, Some(s)) => {
                    put(s, i)?;
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            put(s, content.len().div_ceil(bs))?;
        }
        Ok(written)
    }

    /// Write whole blocks `data` at `offset` through `direct`, then their
    /// checksums through the checksum file as usual (falling back to a normal write
    /// if the disk refuses the direct one).
    fn write_direct(&self, direct: &File, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BS, (end - 1) / BS);
        let _locks = self.stripes.write(first, last);
        let res = (|| {
            let mut b = first;
            for piece in data.chunks(CHUNK_BLOCKS as usize * BLOCK) {
                let mut crcs = [0u8; CHUNK_CRC_BYTES];
                let n = piece.len() / BLOCK;
                for (i, block) in piece.chunks_exact(BLOCK).enumerate() {
                    crc::set_entry(&mut crcs, i, crc::stored_crc(block));
                }
                match direct.write_all_at(piece, b * BS) {
                    Ok(()) => {}
                    Err(e) if crate::sys::is_invalid(&e) => self
                        .data
                        .write_all_at(piece, b * BS)
                        .map_err(|e| self.io_err("write", e))?,
                    Err(e) => return Err(self.io_err("write", e)),
                }
                self.crc
                    .write_all_at(&crcs[..n * CRC_LEN], b * CRC_LEN as u64)
                    .map_err(|e| self.io_err("write checksums", e))?;
                b += n as u64;
            }
            Ok(())
        })();
        self.write_seq.fetch_add(1, SeqCst);
        res
    }

    /// Zero `[offset, offset + len)` (range already checked): whole blocks are
    /// punched out, partial blocks are rewritten.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> Result<()> {
        let res = self.zero_blocks(offset, len);
        self.write_seq.fetch_add(1, SeqCst);
        res
    }

    fn zero_blocks(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let (first, last) = (offset / BS, (end - 1) / BS);
        let _locks = self.stripes.write(first, last);
        // Whole blocks full_first..full_end.
        let full_first = offset.div_ceil(BS);
        let full_end = end / BS;
        if full_first < full_end {
            let n = full_end - full_first;
            sys::punch_hole(&self.data, full_first * BS, n * BS)
                .map_err(|e| self.io_err("punch hole", e))?;
            // A zero block's stored checksum is 0 (see `crc`). Data before checksums,
            // as for writes.
            sys::write_zeros_at(&self.crc, full_first * CRC_LEN as u64, n * CRC_LEN as u64)
                .map_err(|e| self.io_err("write checksums", e))?;
        }
        if first < full_first || full_end <= first {
            self.zero_partial(first, offset, end)?;
        }
        if last != first && full_end <= last {
            self.zero_partial(last, offset, end)?;
        }
        Ok(())
    }

    /// Zero the part of block `b` inside `[offset, end)`.
    fn zero_partial(&self, b: u64, offset: u64, end: u64) -> Result<()> {
        let (bs, be) = (b * BS, (b + 1) * BS);
        let (s, e) = (offset.max(bs), end.min(be));
        let mut block = [0u8; BLOCK];
        self.read_block(b, &mut block)?;
        let part = &mut block[(s - bs) as usize..(e - bs) as usize];
        if part.iter().all(|x| *x == 0) {
            // Already zero (often a hole): writing would only allocate space.
            return Ok(());
        }
        part.fill(0);
        let crc = crc::stored_crc(&block);
        sys::write_zeros_at(&self.data, s, e - s).map_err(|e| self.io_err("write", e))?;
        self.crc
            .write_all_at(&crc.to_le_bytes(), b * CRC_LEN as u64)
            .map_err(|e| self.io_err("write checksums", e))
    }

    /// Count `n` bytes just written; true when [`WRITEBACK_AFTER`] bytes have been
    /// written since the last time this said so (the caller then starts the
    /// write-back). Concurrent writers may both see the threshold; one more
    /// `sync_file_range` is harmless.
    pub(crate) fn note_written(&self, n: u64) -> bool {
        let total = self.unstarted.fetch_add(n, SeqCst).saturating_add(n);
        if total < WRITEBACK_AFTER {
            return false;
        }
        self.unstarted.store(0, SeqCst);
        true
    }

    /// Bytes written since the write-back was last started.
    #[cfg(test)]
    pub(crate) fn unstarted(&self) -> u64 {
        self.unstarted.load(SeqCst)
    }

    /// Start the write-back of the object's dirty pages, without waiting for it.
    pub(crate) fn start_writeback(&self) -> Result<()> {
        sys::start_writeback(&self.data).map_err(|e| self.io_err("start write-back", e))?;
        sys::start_writeback(&self.crc).map_err(|e| self.io_err("start write-back", e))
    }

    /// Make every write and zero that returned before this call durable.
    ///
    /// fdatasync, not fsync: it still flushes the file size and block map that
    /// reading the data back needs (including punched holes), but not timestamps,
    /// so overwriting allocated blocks does not force a journal commit. An fsync
    /// error may have dropped dirty pages; the object's content is then unknown and
    /// the caller must treat the replica as failed, not retry and trust a success.
    pub(crate) fn sync(&self) -> Result<()> {
        let target = self.write_seq.load(SeqCst);
        let mut synced = self.synced_seq.lock();
        if *synced >= target {
            return Ok(());
        }
        // Everything counted by `now` had reached the page cache before the syncs
        // below start, so they cover it.
        let now = self.write_seq.load(SeqCst);
        self.data.sync_data().map_err(|e| self.io_err("fsync", e))?;
        self.crc
            .sync_data()
            .map_err(|e| self.io_err("fsync checksums", e))?;
        *synced = now;
        Ok(())
    }
}

/// Open an object's file; one created is its user's only (mode 0600).
fn open_rw(path: &Path, create: bool, truncate: bool) -> io::Result<File> {
    drove_types::private_fs::options()
        .read(true)
        .write(true)
        .create(create)
        .truncate(truncate)
        .open(path)
}
