//! The file `drove vdi export-diff` writes and `drove vdi import-diff` reads, and
//! the pure decisions behind them: which VDI ids' objects may differ between two
//! snapshots, and which blocks of an object to write.
//!
//! # Format: `drove diff v1`
//! The header line `drove diff v1\n`, then records, each a tag byte and its fields
//! (integers little-endian):
//! - `f` u32 length, name: the older snapshot (FROM); absent in a full diff;
//! - `t` u32 length, name: the newer snapshot (TO);
//! - `s` u64: TO's size in bytes;
//! - `w` u64 offset, u64 length, then the bytes: data;
//! - `z` u64 offset, u64 length: zeros;
//! - `e`: the end (a file without it is cut short and refused).
//!
//! The records are laid out as in RBD's diff v1; the header line differs, so neither
//! tool takes the other's file for its own. `f`, `t` and `s` come first, once each
//! (`t` and `s` are required). Every `w` and `z` lies inside the size.
use anyhow::{bail, Context, Result};
use drove_types::{VdiId, VdiInfo};
use std::io::{Read, Write};

/// The first bytes of every diff.
pub(crate) const MAGIC: &[u8] = b"drove diff v1\n";
/// Blocks compared: a block that differs is written whole.
pub(crate) const BLOCK: usize = 64 << 10;
/// Longest snapshot name a diff may carry.
const MAX_NAME: usize = 1024;
/// Largest data record read (export-diff writes at most one object per record).
pub(crate) const MAX_DATA: u64 = 64 << 20;

/// One record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// The older snapshot.
    From(String),
    /// The newer snapshot.
    To(String),
    /// The newer snapshot's size.
    Size(u64),
    /// Bytes at an offset.
    Data { offset: u64, data: Vec<u8> },
    /// Zeros at an offset.
    Zero { offset: u64, len: u64 },
    /// The end.
    End,
}

/// Write `r` to `w`; the bytes written.
pub(crate) fn write_record(w: &mut (impl Write + ?Sized), r: &Record) -> std::io::Result<u64> {
    match r {
        Record::From(n) | Record::To(n) => {
            w.write_all(if matches!(r, Record::From(_)) {
                b"f"
            } else {
                b"t"
            })?;
            w.write_all(&(n.len() as u32).to_le_bytes())?;
            w.write_all(n.as_bytes())?;
            Ok(5 + n.len() as u64)
        }
        Record::Size(s) => {
            w.write_all(b"s")?;
            w.write_all(&s.to_le_bytes())?;
            Ok(9)
        }
        Record::Data { offset, data } => {
            w.write_all(b"w")?;
            w.write_all(&offset.to_le_bytes())?;
            w.write_all(&(data.len() as u64).to_le_bytes())?;
            w.write_all(data)?;
            Ok(17 + data.len() as u64)
        }
        Record::Zero { offset, len } => {
            w.write_all(b"z")?;
            w.write_all(&offset.to_le_bytes())?;
            w.write_all(&len.to_le_bytes())?;
            Ok(17)
        }
        Record::End => {
            w.write_all(b"e")?;
            Ok(1)
        }
    }
}

/// What a diff says before its first data record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// The older snapshot; `None` for a full diff.
    pub(crate) from: Option<String>,
    /// The newer snapshot.
    pub(crate) to: String,
    /// Its size.
    pub(crate) size: u64,
}

/// Reads a diff record by record, checking each against the format and the size.
pub(crate) struct DiffReader<R: Read> {
    r: R,
    /// Bytes consumed so far.
    pub(crate) consumed: u64,
    header: Option<Header>,
    ended: bool,
}

impl<R: Read> DiffReader<R> {
    /// Check the header line and read the header records; the reader then gives
    /// the data records.
    pub(crate) fn open(r: R) -> Result<(Self, Header)> {
        let mut d = DiffReader {
            r,
            consumed: 0,
            header: None,
            ended: false,
        };
        let mut magic = [0u8; 14];
        d.exact(&mut magic)
            .context("Not a drove diff (too short)")?;
        if magic != MAGIC {
            bail!("Not a drove diff (it does not start with 'drove diff v1')");
        }
        let (mut from, mut to, mut size) = (None, None, None);
        loop {
            let tag = d.tag()?;
            match tag {
                b'f' if from.is_none() && to.is_none() && size.is_none() => from = Some(d.name()?),
                b't' if to.is_none() && size.is_none() => to = Some(d.name()?),
                b's' if size.is_none() => {
                    size = Some(d.u64()?);
                    break;
                }
                b'f' | b't' | b's' => bail!(
                    "Bad diff: header record '{}' repeated or out of order",
                    tag as char
                ),
                t => bail!(
                    "Bad diff: record '{}' before the size record",
                    char::from(t).escape_default()
                ),
            }
        }
        let Some(to) = to else {
            bail!("Bad diff: no 't' (newer snapshot) record");
        };
        let header = Header {
            from,
            to,
            size: size.unwrap_or(0),
        };
        d.header = Some(header.clone());
        Ok((d, header))
    }

    /// The next data record, or `Ok(None)` after the end record.
    pub(crate) fn next_record(&mut self) -> Result<Option<Record>> {
        if self.ended {
            return Ok(None);
        }
        let size = self.header.as_ref().map_or(0, |h| h.size);
        let tag = self.tag()?;
        let rec = match tag {
            b'w' => {
                let offset = self.u64()?;
                let len = self.u64()?;
                check_extent(offset, len, size)?;
                if len > MAX_DATA {
                    bail!("Bad diff: a data record of {len} bytes (at most {MAX_DATA})");
                }
                let mut data = vec![0u8; len as usize];
                self.exact(&mut data)
                    .context("The diff is cut short inside a data record")?;
                Record::Data { offset, data }
            }
            b'z' => {
                let offset = self.u64()?;
                let len = self.u64()?;
                check_extent(offset, len, size)?;
                Record::Zero { offset, len }
            }
            b'e' => {
                self.ended = true;
                return Ok(None);
            }
            b'f' | b't' | b's' => bail!(
                "Bad diff: header record '{}' after the data began",
                tag as char
            ),
            t => bail!(
                "Bad diff: unknown record '{}'",
                char::from(t).escape_default()
            ),
        };
        Ok(Some(rec))
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.r.read_exact(buf)?;
        self.consumed += buf.len() as u64;
        Ok(())
    }

    fn tag(&mut self) -> Result<u8> {
        let mut t = [0u8; 1];
        self.exact(&mut t)
            .context("The diff is cut short (no end record): was it written completely?")?;
        Ok(t[0])
    }

    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.exact(&mut b).context("The diff is cut short")?;
        Ok(u64::from_le_bytes(b))
    }

    fn name(&mut self) -> Result<String> {
        let mut b = [0u8; 4];
        self.exact(&mut b).context("The diff is cut short")?;
        let len = u32::from_le_bytes(b) as usize;
        if len == 0 || len > MAX_NAME {
            bail!("Bad diff: a snapshot name of {len} bytes");
        }
        let mut n = vec![0u8; len];
        self.exact(&mut n).context("The diff is cut short")?;
        String::from_utf8(n).context("Bad diff: a snapshot name that is not UTF-8")
    }
}

fn check_extent(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if len > 0 && end <= size => Ok(()),
        _ => {
            bail!("Bad diff: {len} bytes at offset {offset} do not fit in its size of {size} bytes")
        }
    }
}

/// The blocks of one object (`new` as TO reads, `old` as FROM reads, the same
/// length) to write: runs of consecutive differing [`BLOCK`]s, each as data, or as
/// zeros where TO reads zeros. Offsets are relative to the object.
pub(crate) fn changed_runs(new: &[u8], old: &[u8]) -> Vec<Record> {
    assert_eq!(new.len(), old.len());
    let mut out: Vec<Record> = Vec::new();
    let mut p = 0;
    while p < new.len() {
        let e = (p + BLOCK).min(new.len());
        let (n, o) = (&new[p..e], &old[p..e]);
        if n != o {
            let zero = n.iter().all(|&b| b == 0);
            let offset = p as u64;
            match out.last_mut() {
                Some(Record::Zero { offset: at, len }) if zero && *at + *len == offset => {
                    *len += n.len() as u64;
                }
                Some(Record::Data { offset: at, data })
                    if !zero && *at + data.len() as u64 == offset =>
                {
                    data.extend_from_slice(n);
                }
                _ if zero => out.push(Record::Zero {
                    offset,
                    len: n.len() as u64,
                }),
                _ => out.push(Record::Data {
                    offset,
                    data: n.to_vec(),
                }),
            }
        }
        p = e;
    }
    out
}

/// What export-diff compares: the two snapshots, and the ids whose objects may
/// differ between them.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The older snapshot (none: a full diff).
    pub(crate) from: Option<VdiInfo>,
    /// The newer snapshot.
    pub(crate) to: VdiInfo,
    /// TO's id and its parents' up to, not including, FROM's (all of them without
    /// FROM): the only ids whose objects can read differently in TO and FROM.
    pub(crate) ids: Vec<VdiId>,
}

/// `v` and its parents, nearest first (bounded by the table's size, so a broken
/// parent link cannot loop).
pub(crate) fn chain<'a>(vdis: &'a [VdiInfo], v: &'a VdiInfo) -> Vec<&'a VdiInfo> {
    let mut out = vec![v];
    let mut cur = v.parent;
    while let Some(p) = cur.and_then(|id| vdis.iter().find(|x| x.id == id)) {
        if out.len() > vdis.len() {
            break;
        }
        out.push(p);
        cur = p.parent;
    }
    out
}

/// Work out what `export-diff NAME --from FROM --to TO` compares, from the VDI table.
pub(crate) fn plan(vdis: &[VdiInfo], name: &str, from: Option<&str>, to: &str) -> Result<Plan> {
    let find = |n: &str| vdis.iter().find(|v| v.name == n);
    let Some(vdi) = find(name) else {
        bail!("No VDI named '{name}'");
    };
    let Some(to_v) = find(to) else {
        bail!("No snapshot named '{to}'");
    };
    if !to_v.snapshot {
        bail!(
            "'{to}' is not a snapshot (a VDI being written cannot be compared): take one with `drove vdi snapshot {to} SNAP` and pass --to SNAP"
        );
    }
    if !chain(vdis, vdi).iter().any(|v| v.id == to_v.id) {
        bail!("'{to}' is not a snapshot of '{name}' (see `drove vdi tree`)");
    }
    let up = chain(vdis, to_v);
    let from_v = match from {
        None => None,
        Some(f) => {
            let Some(f_v) = find(f) else {
                bail!("No snapshot named '{f}'");
            };
            if !f_v.snapshot {
                bail!("'{f}' is not a snapshot");
            }
            if f_v.id == to_v.id || !up.iter().any(|v| v.id == f_v.id) {
                bail!("'{f}' is not an older snapshot of '{to}' (see `drove vdi tree`)");
            }
            Some(f_v.clone())
        }
    };
    let ids: Vec<VdiId> = up
        .iter()
        .take_while(|v| from_v.as_ref().is_none_or(|f| f.id != v.id))
        .map(|v| v.id)
        .collect();
    if let Some(v) = up.iter().find(|v| v.object_size != to_v.object_size) {
        bail!(
            "'{}' has objects of {} bytes and '{to}' of {}: cannot compare them",
            v.name,
            v.object_size,
            to_v.object_size
        );
    }
    Ok(Plan {
        from: from_v,
        to: to_v.clone(),
        ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vdi(id: u32, name: &str, parent: Option<u32>, snapshot: bool) -> VdiInfo {
        VdiInfo {
            id: VdiId(id),
            name: name.to_string(),
            size: 64 << 20,
            object_size: 4 << 20,
            copies: 3,
            mode: Default::default(),
            created: 0,
            min_copies: None,
            parent: parent.map(VdiId),
            snapshot,
            ephemeral: false,
            home_zone: None,
            home_copies: None,
            policy: Default::default(),
            max_lag_ms: None,
            max_lag_bytes: None,
            nbd_clients: Vec::new(),
            past_homes: Vec::new(),
        }
    }

    /// base <- s1 <- s2 <- vm (the live VDI), and a clone c of s1.
    fn table() -> Vec<VdiInfo> {
        vec![
            vdi(1, "s1", None, true),
            vdi(2, "s2", Some(1), true),
            vdi(3, "vm", Some(2), false),
            vdi(4, "c", Some(1), false),
        ]
    }

    #[test]
    fn test_the_plan_takes_the_ids_between_the_two_snapshots() {
        let t = table();
        let p = plan(&t, "vm", Some("s1"), "s2").unwrap();
        assert_eq!(p.ids, vec![VdiId(2)]);
        assert_eq!(p.from.unwrap().name, "s1");
        let full = plan(&t, "vm", None, "s2").unwrap();
        assert_eq!(full.ids, vec![VdiId(2), VdiId(1)]);
        assert!(full.from.is_none());
    }

    #[test]
    fn test_the_plan_refuses_what_cannot_be_compared() {
        let t = table();
        let err = |r: Result<Plan>| r.unwrap_err().to_string();
        assert!(err(plan(&t, "nope", None, "s1")).contains("No VDI named 'nope'"));
        assert!(err(plan(&t, "vm", None, "nope")).contains("No snapshot named"));
        assert!(err(plan(&t, "vm", None, "vm")).contains("not a snapshot"));
        // s2 is not in c's lineage.
        assert!(err(plan(&t, "c", None, "s2")).contains("not a snapshot of 'c'"));
        // FROM must be older than TO, and not TO itself.
        assert!(err(plan(&t, "vm", Some("s2"), "s1")).contains("not an older snapshot"));
        assert!(err(plan(&t, "vm", Some("s2"), "s2")).contains("not an older snapshot"));
        assert!(err(plan(&t, "vm", Some("c"), "s2")).contains("'c' is not a snapshot"));
    }

    #[test]
    fn test_changed_runs_write_only_differing_blocks_merged_by_kind() {
        let b = BLOCK;
        let old = vec![7u8; 6 * b];
        let mut new = old.clone();
        new[b..b + 10].fill(1); // block 1: data
        new[2 * b..3 * b].fill(9); // block 2: data, merged with block 1
        new[4 * b..6 * b].fill(0); // blocks 4 and 5: zeros, merged
        let runs = changed_runs(&new, &old);
        assert_eq!(
            runs.len(),
            2,
            "{:?}",
            runs.iter()
                .map(|r| match r {
                    Record::Data { offset, data } => format!("w {offset} {}", data.len()),
                    Record::Zero { offset, len } => format!("z {offset} {len}"),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(
            runs[0],
            Record::Data {
                offset: b as u64,
                data: new[b..3 * b].to_vec()
            }
        );
        assert_eq!(
            runs[1],
            Record::Zero {
                offset: 4 * b as u64,
                len: 2 * b as u64
            }
        );
        assert!(changed_runs(&old, &old).is_empty());
        // A short last block (the VDI's end) is compared too.
        let (o, mut n) = (vec![0u8; b + 100], vec![0u8; b + 100]);
        n[b + 50] = 1;
        assert_eq!(
            changed_runs(&n, &o),
            vec![Record::Data {
                offset: b as u64,
                data: n[b..].to_vec()
            }]
        );
    }

    fn encode(records: &[Record]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        for r in records {
            write_record(&mut out, r).unwrap();
        }
        out
    }

    #[test]
    fn test_a_diff_reads_back_as_written() {
        let records = vec![
            Record::From("s1".into()),
            Record::To("s2".into()),
            Record::Size(1 << 20),
            Record::Data {
                offset: 4096,
                data: vec![5; 100],
            },
            Record::Zero {
                offset: 65536,
                len: 65536,
            },
            Record::End,
        ];
        let bytes = encode(&records);
        let (mut r, h) = DiffReader::open(&bytes[..]).unwrap();
        assert_eq!(
            h,
            Header {
                from: Some("s1".into()),
                to: "s2".into(),
                size: 1 << 20
            }
        );
        assert_eq!(r.next_record().unwrap(), Some(records[3].clone()));
        assert_eq!(r.next_record().unwrap(), Some(records[4].clone()));
        assert_eq!(r.next_record().unwrap(), None);
        assert_eq!(r.consumed, bytes.len() as u64);
        // The sizes write_record reports add up to the file.
        let mut sink = Vec::new();
        let n: u64 = records
            .iter()
            .map(|x| write_record(&mut sink, x).unwrap())
            .sum();
        assert_eq!(n + MAGIC.len() as u64, bytes.len() as u64);
    }

    #[test]
    fn test_bad_diffs_are_refused_with_a_reason() {
        let open_err = |b: &[u8]| DiffReader::open(b).err().unwrap().to_string();
        assert!(open_err(b"rbd diff v1\n").contains("Not a drove diff"));
        assert!(open_err(b"drove").contains("too short"));
        let no_to = encode(&[Record::Size(10)]);
        assert!(open_err(&no_to).contains("no 't'"));
        let data_first = encode(&[Record::To("s".into()), Record::Zero { offset: 0, len: 1 }]);
        assert!(open_err(&data_first).contains("before the size"));
        let twice = encode(&[Record::To("s".into()), Record::To("s".into())]);
        assert!(open_err(&twice).contains("repeated or out of order"));

        let body_err = |recs: &[Record]| {
            let mut all = vec![Record::To("s".into()), Record::Size(1000)];
            all.extend_from_slice(recs);
            let b = encode(&all);
            let (mut r, _) = DiffReader::open(&b[..]).unwrap();
            loop {
                match r.next_record() {
                    Ok(Some(_)) => continue,
                    Ok(None) => return String::new(),
                    Err(e) => return format!("{e:#}"),
                }
            }
        };
        assert!(body_err(&[Record::Zero {
            offset: 990,
            len: 11
        }])
        .contains("do not fit"));
        assert!(body_err(&[Record::Zero {
            offset: u64::MAX,
            len: 2
        }])
        .contains("do not fit"));
        assert!(body_err(&[Record::Size(5)]).contains("after the data began"));
        // No end record: cut short.
        assert!(body_err(&[Record::Zero { offset: 0, len: 1 }]).contains("cut short"));
        assert_eq!(
            body_err(&[Record::Zero { offset: 0, len: 1 }, Record::End]),
            ""
        );
        // A data record claiming more bytes than the file has.
        let mut b = encode(&[Record::To("s".into()), Record::Size(1000)]);
        b.push(b'w');
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&100u64.to_le_bytes());
        b.extend_from_slice(&[1; 10]);
        let (mut r, _) = DiffReader::open(&b[..]).unwrap();
        assert!(format!("{:#}", r.next_record().unwrap_err()).contains("cut short"));
    }
}
