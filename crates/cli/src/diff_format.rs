//! The file `drove vdi export-diff` writes and `drove vdi import-diff` reads. It is an
//! on-disk format: backups made today are read by later versions of drove, so its
//! layout is fixed by its version number, and a change of layout is a new version.
//! The format is described for users in docs/snapshots-clones.md ("The diff file").
//!
//! # Format: `drove diff v2`
//! The line `drove diff v2\n` (the magic `drove diff v`, the version in decimal, a
//! newline), then records. Every record is framed the same way, integers
//! little-endian:
//!
//! ```text
//!   tag u8 | len u32 | body (len bytes) | crc u32 = CRC-32C of tag, len and body
//! ```
//!
//! - `H` header, first and once: TO (the newer snapshot), a byte 0 or 1, FROM (the
//!   older snapshot, when 1; a diff without one is a full diff), then the object
//!   size u32 of the source VDI. A snapshot is its id u32 and size u64 in the source
//!   cluster, its creation time u64 (seconds since 1970), and its name (u16 length,
//!   bytes).
//! - `B` base, only with FROM: offset u64, length u64, and the SHA-256 of what FROM
//!   holds in that range (zeros past FROM's size). One per object the diff changes,
//!   before the records that write into it: import-diff checks that the VDI it
//!   writes holds these bytes before it writes anything.
//! - `W` data: offset u64, then the bytes (the rest of the body, at least one).
//! - `Z` zeros: offset u64, length u64.
//! - `E` end, last, with nothing after it: the number of records before it u64, the
//!   bytes of `W` records u64 and of `Z` records u64, and the SHA-256 of every byte
//!   of the file before the `E` record.
//!
//! `B`, `W` and `Z` come in ascending, non-overlapping order, inside TO's size; with
//! FROM, every `W` and `Z` lies inside the last `B`. A reader refuses anything else.
//! The CRC finds a damaged record where it is; the end record finds a file cut
//! short, records dropped or reordered, and anything appended. Neither is a
//! signature: whoever can write the file can write matching sums.
//!
//! Version 1 (a header line and RBD-like records without any checksum) is not read:
//! drove was not released with it, and a v1 file is refused with a message saying
//! to export it again.
use anyhow::{anyhow, bail, Result};
use drove_types::validate_name;
use std::io::{Read, Write};

/// The first bytes of every diff, followed by the version and a newline.
pub(crate) const MAGIC: &[u8] = b"drove diff v";
/// The version written and read.
pub(crate) const VERSION: u32 = 2;
/// Largest `W` record read (export-diff writes at most one object per record).
pub(crate) const MAX_DATA: u64 = 64 << 20;
/// Largest record body: a `W` record of [`MAX_DATA`] bytes and its offset.
const MAX_BODY: u32 = MAX_DATA as u32 + 8;
/// Length of a SHA-256.
pub(crate) const HASH: usize = 32;

/// The SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; HASH] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; HASH];
    out.copy_from_slice(d.as_ref());
    out
}

/// A snapshot as a diff names it (its id and time are those of the source cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snap {
    pub(crate) name: String,
    pub(crate) id: u32,
    pub(crate) size: u64,
    pub(crate) created: u64,
}

/// What a diff says before its first data record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// The older snapshot, the base; `None` for a full diff.
    pub(crate) from: Option<Snap>,
    /// The newer snapshot.
    pub(crate) to: Snap,
    /// The source VDI's object size (the span of `B` records).
    pub(crate) object_size: u32,
}

/// What the base holds in one range: `len` bytes at `offset` with this SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BaseRange {
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) sha256: [u8; HASH],
}

/// One record after the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    /// What the base holds in a range.
    Base(BaseRange),
    /// Bytes at an offset.
    Data { offset: u64, data: Vec<u8> },
    /// Zeros at an offset.
    Zero { offset: u64, len: u64 },
}

/// What a whole diff held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Bytes of `W` records.
    pub(crate) data_bytes: u64,
    /// Bytes the `Z` records cover.
    pub(crate) zero_bytes: u64,
    /// Size of the file.
    pub(crate) file_bytes: u64,
}

fn put_snap(b: &mut Vec<u8>, s: &Snap) {
    b.extend_from_slice(&s.id.to_le_bytes());
    b.extend_from_slice(&s.size.to_le_bytes());
    b.extend_from_slice(&s.created.to_le_bytes());
    b.extend_from_slice(&(s.name.len() as u16).to_le_bytes());
    b.extend_from_slice(s.name.as_bytes());
}

/// Writes a diff: the header at once, then items, then the end record.
pub(crate) struct DiffWriter<W: Write> {
    w: W,
    hash: ring::digest::Context,
    records: u64,
    totals: Totals,
}

impl<W: Write> DiffWriter<W> {
    /// Start a diff on `w` with `header`.
    pub(crate) fn new(w: W, header: &Header) -> std::io::Result<Self> {
        let mut d = DiffWriter {
            w,
            hash: ring::digest::Context::new(&ring::digest::SHA256),
            records: 0,
            totals: Totals::default(),
        };
        d.raw(format!("drove diff v{VERSION}\n").as_bytes())?;
        let mut b = Vec::new();
        put_snap(&mut b, &header.to);
        match &header.from {
            Some(f) => {
                b.push(1);
                put_snap(&mut b, f);
            }
            None => b.push(0),
        }
        b.extend_from_slice(&header.object_size.to_le_bytes());
        d.record(b'H', &[&b])?;
        Ok(d)
    }

    fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.w.write_all(bytes)?;
        self.hash.update(bytes);
        self.totals.file_bytes += bytes.len() as u64;
        Ok(())
    }

    fn record(&mut self, tag: u8, body: &[&[u8]]) -> std::io::Result<()> {
        let len: usize = body.iter().map(|p| p.len()).sum();
        let mut head = [0u8; 5];
        head[0] = tag;
        head[1..].copy_from_slice(&(len as u32).to_le_bytes());
        let mut crc = crc32c::crc32c(&head);
        for p in body {
            crc = crc32c::crc32c_append(crc, p);
        }
        self.raw(&head)?;
        for p in body {
            self.raw(p)?;
        }
        self.raw(&crc.to_le_bytes())?;
        self.records += 1;
        Ok(())
    }

    /// What the base holds in `len` bytes at `offset`.
    pub(crate) fn base(
        &mut self,
        offset: u64,
        len: u64,
        sha256: &[u8; HASH],
    ) -> std::io::Result<()> {
        self.record(b'B', &[&offset.to_le_bytes(), &len.to_le_bytes(), sha256])
    }

    /// `data` at `offset`.
    pub(crate) fn data(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.record(b'W', &[&offset.to_le_bytes(), data])?;
        self.totals.data_bytes += data.len() as u64;
        Ok(())
    }

    /// `len` zeros at `offset`.
    pub(crate) fn zero(&mut self, offset: u64, len: u64) -> std::io::Result<()> {
        self.record(b'Z', &[&offset.to_le_bytes(), &len.to_le_bytes()])?;
        self.totals.zero_bytes += len;
        Ok(())
    }

    /// Write the end record; the writer and what the diff holds.
    pub(crate) fn finish(mut self) -> std::io::Result<(W, Totals)> {
        let digest = self.hash.clone().finish();
        let (records, t) = (self.records, self.totals);
        self.record(
            b'E',
            &[
                &records.to_le_bytes(),
                &t.data_bytes.to_le_bytes(),
                &t.zero_bytes.to_le_bytes(),
                digest.as_ref(),
            ],
        )?;
        self.w.flush()?;
        Ok((self.w, self.totals))
    }
}

/// Reads a diff record by record, checking every record's CRC, the order and
/// extents of the records, and at the end the whole file against its end record.
pub(crate) struct DiffReader<R: Read> {
    r: R,
    hash: ring::digest::Context,
    /// Bytes consumed so far.
    pub(crate) consumed: u64,
    records: u64,
    header: Header,
    totals: Totals,
    /// Where the last `B`, `W` or `Z` ended (they ascend).
    base_end: u64,
    write_end: u64,
    /// The range of the last `B` record (incremental diffs).
    base: Option<(u64, u64)>,
    ended: bool,
}

/// Field-by-field reading of one record's body.
struct Body<'a> {
    b: &'a [u8],
    tag: u8,
}

impl Body<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.b.len() < n {
            bail!("Bad diff: a '{}' record is too short", self.tag as char);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn u32(&mut self) -> Result<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn hash(&mut self) -> Result<[u8; HASH]> {
        let mut a = [0u8; HASH];
        a.copy_from_slice(self.take(HASH)?);
        Ok(a)
    }

    fn snap(&mut self) -> Result<Snap> {
        let id = self.u32()?;
        let size = self.u64()?;
        let created = self.u64()?;
        let n = self.take(2)?;
        let len = u16::from_le_bytes([n[0], n[1]]) as usize;
        let name = String::from_utf8(self.take(len)?.to_vec())
            .map_err(|_| anyhow!("Bad diff: a snapshot name that is not UTF-8"))?;
        validate_name(&name).map_err(|e| anyhow!("Bad diff: {e}"))?;
        Ok(Snap {
            name,
            id,
            size,
            created,
        })
    }

    fn done(&self) -> Result<()> {
        if !self.b.is_empty() {
            bail!(
                "Bad diff: a '{}' record has {} bytes too many",
                self.tag as char,
                self.b.len()
            );
        }
        Ok(())
    }
}

impl<R: Read> DiffReader<R> {
    /// Check the magic, the version and the header record.
    pub(crate) fn open(r: R) -> Result<Self> {
        let mut d = DiffReader {
            r,
            hash: ring::digest::Context::new(&ring::digest::SHA256),
            consumed: 0,
            records: 0,
            header: Header {
                from: None,
                to: Snap {
                    name: String::new(),
                    id: 0,
                    size: 0,
                    created: 0,
                },
                object_size: 0,
            },
            totals: Totals::default(),
            base_end: 0,
            write_end: 0,
            base: None,
            ended: false,
        };
        let mut magic = [0u8; MAGIC.len()];
        d.exact(&mut magic)
            .map_err(|_| anyhow!("Not a drove diff (it is too short)"))?;
        d.hash.update(&magic);
        if magic != MAGIC {
            bail!("Not a drove diff (it does not start with 'drove diff v')");
        }
        let mut version = Vec::new();
        loop {
            let mut c = [0u8; 1];
            d.exact(&mut c)
                .map_err(|_| anyhow!("Not a drove diff (it is too short)"))?;
            d.hash.update(&c);
            match c[0] {
                b'\n' if !version.is_empty() => break,
                b'0'..=b'9' if version.len() < 4 => version.push(c[0]),
                _ => bail!("Not a drove diff (no version after 'drove diff v')"),
            }
        }
        let version: u32 = String::from_utf8_lossy(&version).parse().unwrap_or(0);
        match version {
            VERSION => {}
            1 => bail!(
                "This diff is in format v1, which had no checksums and recorded no base \
                 content; this drove reads v{VERSION} only: make it again with `drove vdi \
                 export-diff`"
            ),
            v => bail!(
                "This diff is in format v{v}, which this drove does not know (it reads \
                 v{VERSION}): use the drove that wrote it"
            ),
        }
        let (tag, body) = d.record()?;
        if tag != b'H' {
            bail!("Bad diff: it does not begin with its header record");
        }
        let mut b = Body { b: &body, tag };
        let to = b.snap()?;
        let from = match b.take(1)?[0] {
            0 => None,
            1 => Some(b.snap()?),
            x => bail!("Bad diff: base flag {x}"),
        };
        let object_size = b.u32()?;
        b.done()?;
        if to.size == 0 {
            bail!("Bad diff: its snapshot '{}' has a size of 0", to.name);
        }
        if let Some(f) = &from {
            // A VDI only grows: its later snapshot is not smaller.
            if f.size > to.size {
                bail!(
                    "Bad diff: its base '{}' ({} bytes) is larger than '{}' ({} bytes)",
                    f.name,
                    f.size,
                    to.name,
                    to.size
                );
            }
        }
        if object_size == 0 || u64::from(object_size) > MAX_DATA {
            bail!("Bad diff: an object size of {object_size} bytes");
        }
        d.header = Header {
            from,
            to,
            object_size,
        };
        Ok(d)
    }

    /// The header.
    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// What the diff held; complete once [`DiffReader::next_item`] gave `None`.
    pub(crate) fn totals(&self) -> Totals {
        Totals {
            file_bytes: self.consumed,
            ..self.totals
        }
    }

    /// The next item, or `Ok(None)` once the end record checked out and nothing
    /// follows it.
    pub(crate) fn next_item(&mut self) -> Result<Option<Item>> {
        if self.ended {
            return Ok(None);
        }
        let at = self.consumed;
        let n = self.records;
        let (tag, body) = self.record()?;
        let mut b = Body { b: &body, tag };
        let size = self.header.to.size;
        let incremental = self.header.from.is_some();
        let item = match tag {
            b'B' if incremental => {
                let (offset, len, sha256) = (b.u64()?, b.u64()?, b.hash()?);
                b.done()?;
                let end = extent(offset, len, size, at)?;
                if offset < self.base_end || len > MAX_DATA {
                    bail!("Bad diff: the base record at byte {at} is out of order or too long");
                }
                self.base_end = end;
                self.base = Some((offset, end));
                Item::Base(BaseRange {
                    offset,
                    len,
                    sha256,
                })
            }
            b'W' => {
                let offset = b.u64()?;
                let data = b.b.to_vec();
                self.write_at(offset, data.len() as u64, at)?;
                self.totals.data_bytes += data.len() as u64;
                Item::Data { offset, data }
            }
            b'Z' => {
                let (offset, len) = (b.u64()?, b.u64()?);
                b.done()?;
                self.write_at(offset, len, at)?;
                self.totals.zero_bytes += len;
                Item::Zero { offset, len }
            }
            b'E' => {
                let (records, data, zero, sha) = (b.u64()?, b.u64()?, b.u64()?, b.hash()?);
                b.done()?;
                // The hash covers everything before the end record (whose bytes
                // `record` left out of it).
                let got = self.hash.clone().finish();
                if records != n
                    || data != self.totals.data_bytes
                    || zero != self.totals.zero_bytes
                    || sha[..] != got.as_ref()[..]
                {
                    bail!(
                        "Damaged diff: its end record does not match what came before it \
                         (records dropped, reordered or changed)"
                    );
                }
                let mut extra = [0u8; 1];
                match self.r.read(&mut extra) {
                    Ok(0) => {}
                    Ok(_) => bail!(
                        "Bad diff: bytes follow its end record (at byte {})",
                        self.consumed
                    ),
                    Err(e) => bail!("Cannot read the diff: {e}"),
                }
                self.ended = true;
                return Ok(None);
            }
            b'B' => bail!("Bad diff: a base record in a full diff (at byte {at})"),
            b'H' => bail!("Bad diff: a second header record (at byte {at})"),
            t => bail!(
                "Bad diff: unknown record '{}' at byte {at}",
                char::from(t).escape_default()
            ),
        };
        Ok(Some(item))
    }

    /// Check a `W` or `Z` record's extent: inside the size, after the last one, and
    /// inside the last base range of an incremental diff.
    fn write_at(&mut self, offset: u64, len: u64, at: u64) -> Result<()> {
        let end = extent(offset, len, self.header.to.size, at)?;
        if offset < self.write_end {
            bail!("Bad diff: the record at byte {at} overlaps or precedes the one before it");
        }
        if self.header.from.is_some() && !self.base.is_some_and(|(s, e)| s <= offset && end <= e) {
            bail!("Bad diff: the record at byte {at} writes where no base record covers it");
        }
        self.write_end = end;
        Ok(())
    }

    /// Fill `buf`, counting the bytes (the caller adds them to the hash).
    fn exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.r.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                anyhow!(
                    "The diff is cut short at byte {} (it has no end record): was it \
                     written completely?",
                    self.consumed
                )
            } else {
                anyhow!("Cannot read the diff: {e}")
            }
        })?;
        self.consumed += buf.len() as u64;
        Ok(())
    }

    /// One framed record, its CRC checked: (tag, body).
    fn record(&mut self) -> Result<(u8, Vec<u8>)> {
        let at = self.consumed;
        let mut head = [0u8; 5];
        self.exact(&mut head)?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if len > MAX_BODY {
            bail!("Damaged diff: the record at byte {at} claims {len} bytes (at most {MAX_BODY})");
        }
        let mut body = vec![0u8; len as usize];
        self.exact(&mut body)?;
        let mut crc = [0u8; 4];
        self.exact(&mut crc)?;
        let want = crc32c::crc32c_append(crc32c::crc32c(&head), &body);
        if u32::from_le_bytes(crc) != want {
            bail!(
                "Damaged diff: the record at byte {at} fails its checksum (the file was \
                 altered or damaged)"
            );
        }
        // The end record is not in the hash it carries.
        if head[0] != b'E' {
            self.hash.update(&head);
            self.hash.update(&body);
            self.hash.update(&crc);
        }
        self.records += 1;
        Ok((head[0], body))
    }
}

/// The end of `len` bytes at `offset` when they fit in `size` (and are not empty).
fn extent(offset: u64, len: u64, size: u64, at: u64) -> Result<u64> {
    match offset.checked_add(len) {
        Some(end) if len > 0 && end <= size => Ok(end),
        _ => bail!(
            "Bad diff: the record at byte {at} covers {len} bytes at offset {offset}, \
             outside its size of {size} bytes"
        ),
    }
}

/// Read a whole diff, checking all of it: the header, the base ranges of an
/// incremental diff (kept, for the check of the VDI it applies to) and the totals.
pub(crate) fn verify<R: Read>(r: R) -> Result<(Header, Vec<BaseRange>, Totals)> {
    let mut d = DiffReader::open(r)?;
    let mut bases = Vec::new();
    while let Some(item) = d.next_item()? {
        if let Item::Base(b) = item {
            bases.push(b);
        }
    }
    Ok((d.header.clone(), bases, d.totals()))
}

#[cfg(test)]
#[path = "diff_format_tests.rs"]
mod tests;
