//! What only the on-disk store does: sparse files, hole punching, checksum
//! verification against tampered files, durability across a reopen.
mod common;
use common::find;
use drove_objstore::{FileStore, ObjectStore};
use drove_types::{ErrorKind, ObjVersion, ObjectId, VdiId};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

const OBJ: u64 = 4 << 20;

fn oid(vdi: u32, index: u32) -> ObjectId {
    ObjectId::new(VdiId(vdi), index)
}

fn open(dir: &Path) -> FileStore {
    FileStore::open(dir, OBJ).unwrap()
}

fn flip_byte(path: &Path, at: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
}

/// The content digest is read from the checksum file, not the data: a byte that
/// rotted under its checksum does not change it (reads and scrubs find that), a
/// changed checksum does.
#[test]
fn test_the_content_digest_reads_the_checksums_not_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let o = oid(0xab, 4);
    s.write(o, 0, &[7u8; 4 * 4096]).unwrap();
    let before = s.content_crc(o, OBJ as u32).unwrap();
    assert_eq!(
        before,
        drove_objstore::content_crc(&s.read(o, 0, OBJ as u32).unwrap())
    );
    flip_byte(&find(dir.path(), &o.to_string()), 4096 + 5);
    assert_eq!(s.read(o, 0, 8192).unwrap_err().kind(), ErrorKind::Corrupt);
    assert_eq!(s.content_crc(o, OBJ as u32).unwrap(), before);
    flip_byte(&find(dir.path(), &format!("{o}.crc")), 3 * 4 + 1);
    assert_ne!(s.content_crc(o, OBJ as u32).unwrap(), before);
}

#[test]
fn test_flipped_data_byte_reads_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let o = oid(0xab, 3);
    s.write(o, 0, &[7u8; 4 * 4096]).unwrap();
    flip_byte(&find(dir.path(), &o.to_string()), 2 * 4096 + 100);
    let e = s.read(o, 2 * 4096 + 4000, 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.message().contains(&o.to_string()), "{e}");
    assert!(e.message().contains("block 2"), "{e}");
    // Any read touching block 2 fails; its neighbours still read.
    assert_eq!(
        s.read(o, 0, 3 * 4096).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    assert_eq!(s.read(o, 4096, 4096).unwrap(), vec![7u8; 4096]);
    assert_eq!(s.read(o, 3 * 4096, 4096).unwrap(), vec![7u8; 4096]);
    // A partial write cannot fold the bad bytes into a fresh checksum ...
    assert_eq!(
        s.write(o, 2 * 4096 + 1, &[1]).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    assert_eq!(
        s.write_zeroes(o, 2 * 4096, 10).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    // ... a whole-block write replaces the block without reading it.
    s.write(o, 2 * 4096, &[9u8; 4096]).unwrap();
    assert_eq!(
        s.read(o, 0, 4 * 4096).unwrap()[2 * 4096..3 * 4096],
        [9u8; 4096]
    );
}

#[test]
fn test_flipped_checksum_or_data_in_a_hole_reads_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let o = oid(1, 1);
    s.write(o, 5 * 4096, &[1u8; 4096]).unwrap();
    // Block 5's stored checksum.
    flip_byte(&find(dir.path(), &format!("{o}.crc")), 5 * 4 + 1);
    assert_eq!(
        s.read(o, 5 * 4096, 1).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    // Garbage appearing in a hole (block 1) is caught too.
    let data = find(dir.path(), &o.to_string());
    OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .write_all_at(&[1], 4096 + 7)
        .unwrap();
    let e = s.read(o, 0, 2 * 4096).unwrap_err();
    assert!(e.message().contains("block 1"), "{e}");
}

#[test]
fn test_write_zeroes_punches_holes() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let o = oid(2, 0);
    s.write(o, 0, &vec![0x5a; 1 << 20]).unwrap();
    s.flush(&[o]).unwrap();
    let data = find(dir.path(), &o.to_string());
    let before = fs::metadata(&data).unwrap();
    assert!(before.blocks() * 512 >= 1 << 20);
    assert!(s.used_bytes().unwrap() >= 1 << 20);
    // Unaligned ends: the 1000 bytes at each end stay, everything between is punched.
    s.write_zeroes(o, 1000, (1 << 20) - 2000).unwrap();
    s.flush(&[o]).unwrap();
    let after = fs::metadata(&data).unwrap();
    assert_eq!(after.len(), before.len(), "size kept");
    assert!(
        after.blocks() * 512 <= 2 * 4096 + 64 * 1024,
        "{} blocks left",
        after.blocks()
    );
    assert!(s.used_bytes().unwrap() < 1 << 17);
    let got = s.read(o, 0, 1 << 20).unwrap();
    assert!(got[..1000].iter().all(|b| *b == 0x5a));
    assert!(got[1000..(1 << 20) - 1000].iter().all(|b| *b == 0));
    assert!(got[(1 << 20) - 1000..].iter().all(|b| *b == 0x5a));
}

#[test]
fn test_objects_are_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.write(oid(3, 0), OBJ - 4096, &[1u8; 4096]).unwrap();
    s.write_zeroes(oid(3, 0), 0, 8192).unwrap();
    s.flush(&[]).unwrap();
    let used = s.used_bytes().unwrap();
    assert!((4096..=64 * 1024).contains(&used), "used {used}");
}

#[test]
fn test_data_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let objects: Vec<_> = (0..20).map(|i| oid(4 + i % 3, i * 1000)).collect();
    {
        let s = open(dir.path());
        for (i, o) in objects.iter().enumerate() {
            s.write(*o, i as u64 * 777, &[i as u8 + 1; 5000]).unwrap();
        }
        s.write_zeroes(objects[0], 0, OBJ).unwrap();
        s.delete(objects[1]).unwrap();
        s.flush(&[]).unwrap();
    }
    let s = open(dir.path());
    let mut listed = s.list().unwrap();
    listed.sort();
    let mut want: Vec<_> = objects
        .iter()
        .copied()
        .filter(|o| *o != objects[1])
        .collect();
    want.sort();
    assert_eq!(listed, want);
    assert_eq!(s.read(objects[0], 0, 5000).unwrap(), vec![0u8; 5000]);
    assert!(!s.exists(objects[1]).unwrap());
    for (i, o) in objects.iter().enumerate().skip(2) {
        assert_eq!(
            s.read(*o, i as u64 * 777, 5000).unwrap(),
            vec![i as u8 + 1; 5000]
        );
    }
}

#[test]
fn test_version_survives_reopen_and_a_damaged_one_reads_as_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (oid(7, 1), oid(7, 2));
    let v = ObjVersion {
        generation: 12,
        epoch: 345,
    };
    {
        let s = open(dir.path());
        // The last block too: the version record sits just past its checksum.
        s.write(a, OBJ - 4096, &[9u8; 4096]).unwrap();
        s.set_version(a, v).unwrap();
        s.write(b, 0, &[8u8; 4096]).unwrap();
        s.set_version(b, v).unwrap();
        s.flush(&[]).unwrap();
    }
    flip_byte(&find(dir.path(), &format!("{b}.crc")), OBJ / 4096 * 4 + 3);
    let s = open(dir.path());
    assert_eq!(s.version(a).unwrap(), v);
    assert_eq!(s.read(a, OBJ - 4096, 4096).unwrap(), vec![9u8; 4096]);
    assert_eq!(s.version(b).unwrap(), ObjVersion::default());
    assert_eq!(s.read(b, 0, 4096).unwrap(), vec![8u8; 4096]);
}

#[test]
fn test_writes_larger_than_one_checksum_batch() {
    // 4 MiB of data is one batch of checksums; go past it, unaligned, twice.
    let dir = tempfile::tempdir().unwrap();
    let s = FileStore::open(dir.path(), 16 << 20).unwrap();
    let o = oid(5, 0);
    let data: Vec<u8> = (0..(9 << 20) + 123).map(|i: u32| (i % 251) as u8).collect();
    s.write(o, 4095, &data).unwrap();
    assert_eq!(s.read(o, 4095, data.len() as u32).unwrap(), data);
    s.write_zeroes(o, 4095 + 100, 6 << 20).unwrap();
    let got = s.read(o, 0, 16 << 20).unwrap();
    assert!(got[..4095].iter().all(|b| *b == 0));
    assert_eq!(got[4095..4195], data[..100]);
    assert!(got[4195..4195 + (6 << 20)].iter().all(|b| *b == 0));
    assert_eq!(
        got[4195 + (6 << 20)..4095 + data.len()],
        data[100 + (6 << 20)..]
    );
}

#[test]
fn test_bad_object_size_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let e = FileStore::open(dir.path(), 1000).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Invalid);
}

/// A block whose data a power loss kept from the disk (its checksum written, its
/// data not: here, the data changed under its checksum) reads as corrupt, and
/// `read_unverified` gives the bytes as they lie, for recovery to seal again when
/// every copy fails the block. Written back whole, it verifies.
#[test]
fn test_a_torn_block_reads_unverified_as_it_lies_and_seals_by_a_whole_write() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let o = oid(0xab, 5);
    s.write(o, 0, &[7u8; 3 * 4096]).unwrap();
    flip_byte(&find(dir.path(), &o.to_string()), 4096 + 9);
    assert_eq!(
        s.read(o, 4096, 4096).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    let raw = s.read_unverified(o, 1).unwrap();
    let mut expect = vec![7u8; 4096];
    expect[9] ^= 0x40;
    assert_eq!(raw, expect);
    // A block never written, and an object that does not exist, read as zeros.
    assert_eq!(s.read_unverified(o, 100).unwrap(), vec![0u8; 4096]);
    assert_eq!(s.read_unverified(oid(0xab, 6), 0).unwrap(), vec![0u8; 4096]);
    // Past the object's end is refused.
    assert!(s.read_unverified(o, OBJ / 4096).is_err());
    s.write(o, 4096, &raw).unwrap();
    assert_eq!(s.read(o, 4096, 4096).unwrap(), expect);
    assert_eq!(s.read(o, 0, 4096).unwrap(), vec![7u8; 4096]);
}
