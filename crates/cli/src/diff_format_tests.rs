//! Tests of the diff format: what is written reads back, and every kind of damage is
//! refused by the reader before anything could be applied (one altered byte
//! anywhere, a cut anywhere, dropped or appended bytes, old and unknown versions,
//! records out of order or outside what the header allows).
use super::*;

fn snap(name: &str, id: u32, size: u64) -> Snap {
    Snap {
        name: name.to_string(),
        id,
        size,
        created: 1_790_000_000 + u64::from(id),
    }
}

fn header(from: bool) -> Header {
    Header {
        from: from.then(|| snap("mon", 3, 1 << 20)),
        to: snap("tue", 4, 2 << 20),
        object_size: 4 << 20,
    }
}

/// An incremental diff: a base range, data and zeros inside it, a second range
/// with data.
fn incremental() -> Vec<u8> {
    let mut w = DiffWriter::new(Vec::new(), &header(true)).unwrap();
    w.base(0, 65536, &sha256(&[0u8; 65536])).unwrap();
    w.data(4096, &[0xa5; 100]).unwrap();
    w.zero(8192, 4096).unwrap();
    w.base(1 << 20, 65536, &sha256(b"other")).unwrap();
    w.data((1 << 20) + 10, b"tuesday").unwrap();
    w.finish().unwrap().0
}

fn items(bytes: &[u8]) -> Result<(Header, Vec<Item>, Totals)> {
    let mut r = DiffReader::open(bytes)?;
    let mut out = Vec::new();
    while let Some(i) = r.next_item()? {
        out.push(i);
    }
    Ok((r.header().clone(), out, r.totals()))
}

fn err(bytes: &[u8]) -> String {
    match items(bytes) {
        Ok(_) => String::new(),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn test_a_diff_reads_back_as_written() {
    let bytes = incremental();
    assert!(bytes.starts_with(b"drove diff v2\n"));
    let (h, got, t) = items(&bytes).unwrap();
    assert_eq!(h, header(true));
    assert_eq!(
        got,
        vec![
            Item::Base(BaseRange {
                offset: 0,
                len: 65536,
                sha256: sha256(&[0u8; 65536])
            }),
            Item::Data {
                offset: 4096,
                data: vec![0xa5; 100]
            },
            Item::Zero {
                offset: 8192,
                len: 4096
            },
            Item::Base(BaseRange {
                offset: 1 << 20,
                len: 65536,
                sha256: sha256(b"other")
            }),
            Item::Data {
                offset: (1 << 20) + 10,
                data: b"tuesday".to_vec()
            },
        ]
    );
    assert_eq!(
        t,
        Totals {
            data_bytes: 107,
            zero_bytes: 4096,
            file_bytes: bytes.len() as u64
        }
    );
    let (_, bases, vt) = verify(&bytes[..]).unwrap();
    assert_eq!(bases.len(), 2);
    assert_eq!(vt, t);
    // The writer's totals are the reader's.
    let mut w = DiffWriter::new(Vec::new(), &header(false)).unwrap();
    w.data(0, &[1; 10]).unwrap();
    let (full, wt) = w.finish().unwrap();
    assert_eq!(wt.file_bytes, full.len() as u64);
    let (h, got, _) = items(&full).unwrap();
    assert!(h.from.is_none());
    assert_eq!(got.len(), 1);
}

#[test]
fn test_one_altered_byte_anywhere_is_refused() {
    let bytes = incremental();
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            let e = err(&b);
            assert!(!e.is_empty(), "byte {i} ^ {flip:#x} was not noticed");
        }
    }
    // Inside a record's body, the record's checksum is what notices.
    let at = bytes.windows(7).position(|w| w == b"tuesday").unwrap();
    let mut b = bytes.clone();
    b[at] = b'T';
    assert!(err(&b).contains("fails its checksum"), "{}", err(&b));
}

#[test]
fn test_a_cut_anywhere_is_refused() {
    let bytes = incremental();
    for n in 0..bytes.len() {
        let e = err(&bytes[..n]);
        assert!(
            e.contains("cut short") || e.contains("Not a drove diff"),
            "cut at {n}: {e:?}"
        );
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(
        err(&long).contains("follow its end record"),
        "{}",
        err(&long)
    );
}

/// `bytes` without its record number `k` (0: the header), every CRC still right.
fn without_record(bytes: &[u8], k: usize) -> Vec<u8> {
    let mut at = MAGIC.len() + 2;
    for _ in 0..k {
        let len = u32::from_le_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        at += 5 + len + 4;
    }
    let len = u32::from_le_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
    let mut out = bytes[..at].to_vec();
    out.extend_from_slice(&bytes[at + 5 + len + 4..]);
    out
}

#[test]
fn test_a_dropped_record_is_refused_by_the_end_record() {
    let bytes = incremental();
    // Dropping the zeros record (number 3) leaves a well-formed file otherwise.
    let e = err(&without_record(&bytes, 3));
    assert!(e.contains("end record does not match"), "{e}");
    // Dropping a base record leaves data no base covers.
    let e = err(&without_record(&bytes, 4));
    assert!(e.contains("no base record covers"), "{e}");
}

#[test]
fn test_other_versions_are_refused_with_a_reason() {
    let e = err(b"drove diff v1\nf\x02\x00\x00\x00s1t");
    assert!(e.contains("format v1") && e.contains("export-diff"), "{e}");
    let e = err(b"drove diff v3\nH");
    assert!(
        e.contains("format v3") && e.contains("does not know"),
        "{e}"
    );
    assert!(err(b"rbd diff v1\n").contains("Not a drove diff"));
    assert!(err(b"drove diff vX\n").contains("no version"));
    assert!(err(b"").contains("Not a drove diff"));
}

#[test]
fn test_well_formed_records_that_break_the_rules_are_refused() {
    let check = |h: Header, f: &dyn Fn(&mut DiffWriter<Vec<u8>>), want: &str| {
        let mut w = DiffWriter::new(Vec::new(), &h).unwrap();
        f(&mut w);
        let e = err(&w.finish().unwrap().0);
        assert!(e.contains(want), "wanted {want:?}, got {e:?}");
    };
    let inc = || header(true);
    let full = || header(false);
    let size = 2u64 << 20;
    check(
        full(),
        &|w| w.zero(size - 1, 2).unwrap(),
        "outside its size",
    );
    check(
        full(),
        &|w| w.zero(u64::MAX, 2).unwrap(),
        "outside its size",
    );
    check(full(), &|w| w.zero(0, 0).unwrap(), "outside its size");
    check(
        full(),
        &|w| {
            w.zero(100, 10).unwrap();
            w.zero(105, 10).unwrap()
        },
        "overlaps or precedes",
    );
    check(
        full(),
        &|w| w.base(0, 10, &[0; HASH]).unwrap(),
        "base record in a full diff",
    );
    check(
        inc(),
        &|w| w.data(0, b"x").unwrap(),
        "no base record covers",
    );
    check(
        inc(),
        &|w| {
            w.base(0, 10, &[0; HASH]).unwrap();
            w.data(5, &[1; 10]).unwrap()
        },
        "no base record covers",
    );
    check(
        inc(),
        &|w| {
            w.base(100, 10, &[0; HASH]).unwrap();
            w.base(0, 10, &[0; HASH]).unwrap()
        },
        "out of order",
    );
    let mut h = inc();
    h.from = Some(snap("mon", 3, 3 << 20));
    check(h, &|_| {}, "larger than");
    let mut h = full();
    h.to.name = "bad\nname".into();
    check(h, &|_| {}, "Bad diff");
    let mut h = full();
    h.object_size = 0;
    check(h, &|_| {}, "object size");
}

/// A diff file as the last release (5def163) writes it: `incremental()`'s bytes,
/// checked in (diff_golden_v2.txt, hex). diff_format.rs is unchanged since
/// 5def163, so this tree's writer printed what that release writes. A backup made
/// by that release must read as the same header, records and totals, and this
/// writer must still write those bytes.
#[test]
fn test_a_diff_of_the_last_release_reads_as_written() {
    let hex = include_str!("diff_golden_v2.txt").trim();
    let golden: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert!(golden.starts_with(b"drove diff v2\n"));
    assert_eq!(items(&golden).unwrap(), items(&incremental()).unwrap());
    verify(&golden[..]).unwrap();
    assert_eq!(
        incremental(),
        golden,
        "the writer still writes version 2's bytes"
    );
}
