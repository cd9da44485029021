//! Golden files of the object store's on-disk format: a data directory written by
//! the previous release (5def163) and checked in as it left it
//! (tests/golden/store_5def163/objects/...). The format has no version number of
//! its own; these files are what keeps it from changing unnoticed:
//!
//! - the data file of an object holds its bytes at their offsets (sparse);
//! - its `.crc` file holds one little-endian `crc32c(block) ^ crc32c(zeros)` per
//!   4 KiB block, then, just past the checksums of the largest object, the version
//!   record (generation, epoch, crc32c of both);
//! - the tree is `objects/<vdi %08x>/<index >> 10 %06x>/<oid>` (`.crc`).
//!
//! This build must read every object as that release wrote it (bytes, holes,
//! versions, a block whose checksum no longer matches), and write the same
//! operations as exactly the same files, so that a node of either build reads the
//! other's disk.
//!
//! The files were made by running [`write_golden_files`] in a checkout of 5def163
//! (this file copied into its crates/objstore/tests/):
//! `DROVE_GOLDEN_OUT=DIR cargo test --release -p drove-objstore --test golden -- --ignored`.
mod common;
use common::{files_under, find};
use drove_objstore::{FileStore, ObjectStore};
use drove_types::{ErrorKind, ObjVersion, ObjectId, VdiId};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Object size of the golden store: small, so the files are small (the version
/// record sits after 4 checksums, at byte 16 of a `.crc` file).
const OBJ: u64 = 16 << 10;
const BS: usize = 4096;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/store_5def163")
}

/// Object A: written whole block then partly; B: created with a version, then a
/// block zeroed, in another group directory; C: in another VDI, its block 2 rotted
/// after the write (one byte flipped in the data file).
fn a() -> ObjectId {
    ObjectId::new(VdiId(0x2a), 3)
}
fn b() -> ObjectId {
    ObjectId::new(VdiId(0x2a), 1025)
}
fn c() -> ObjectId {
    ObjectId::new(VdiId(0x2b), 0)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

/// The operations whose result is the golden store, ending with C's rot.
fn write_the_store(dir: &Path) {
    let s = FileStore::open(dir, OBJ).unwrap();
    s.write(a(), 0, &pattern(0xa1, BS)).unwrap();
    s.write(a(), BS as u64 + 10, &pattern(0xb2, 100)).unwrap();
    s.set_version(
        a(),
        ObjVersion {
            generation: 7,
            epoch: 3,
        },
    )
    .unwrap();
    s.create(
        b(),
        &pattern(0x11, 3 * BS),
        ObjVersion {
            generation: 1,
            epoch: 9,
        },
    )
    .unwrap();
    s.write_zeroes(b(), BS as u64, BS as u64).unwrap();
    s.write(c(), 0, &pattern(0x33, OBJ as usize)).unwrap();
    s.flush(&[a(), b(), c()]).unwrap();
    drop(s);
    let data = find(dir, &c().to_string());
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&data)
        .unwrap();
    let mut byte = [0u8; 1];
    f.read_exact_at(&mut byte, 2 * BS as u64 + 7).unwrap();
    f.write_all_at(&[byte[0] ^ 0x40], 2 * BS as u64 + 7)
        .unwrap();
}

/// Every file under `dir`, by path relative to it, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    files_under(dir)
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            (rel, fs::read(&p).unwrap())
        })
        .collect()
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, bytes) in files(from) {
        let p = to.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }
}

#[test]
fn test_the_last_releases_object_files_read_as_it_wrote_them() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&golden_dir(), dir.path());
    let s = FileStore::open(dir.path(), OBJ).unwrap();

    let mut listed = s.list().unwrap();
    listed.sort();
    let mut want = vec![a(), b(), c()];
    want.sort();
    assert_eq!(listed, want);

    // A: a whole block, then 100 bytes into the second, the rest a hole.
    let got = s.read(a(), 0, OBJ as u32).unwrap();
    let mut expect = vec![0u8; OBJ as usize];
    expect[..BS].copy_from_slice(&pattern(0xa1, BS));
    expect[BS + 10..BS + 110].copy_from_slice(&pattern(0xb2, 100));
    assert_eq!(got, expect, "A's bytes");
    assert_eq!(
        s.version(a()).unwrap(),
        ObjVersion {
            generation: 7,
            epoch: 3
        }
    );

    // B: created with three blocks and a version, its middle block zeroed.
    let mut expect = pattern(0x11, 3 * BS);
    expect[BS..2 * BS].fill(0);
    expect.resize(OBJ as usize, 0);
    assert_eq!(s.read(b(), 0, OBJ as u32).unwrap(), expect, "B's bytes");
    assert_eq!(
        s.version(b()).unwrap(),
        ObjVersion {
            generation: 1,
            epoch: 9
        }
    );

    // C: the rotted block is refused as corrupt; the others read; the version
    // never set reads as zero.
    let e = s.read(c(), 2 * BS as u64, BS as u32).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    let whole = pattern(0x33, OBJ as usize);
    assert_eq!(s.read(c(), 0, 2 * BS as u32).unwrap(), whole[..2 * BS]);
    assert_eq!(
        s.read(c(), 3 * BS as u64, BS as u32).unwrap(),
        whole[3 * BS..]
    );
    assert_eq!(s.version(c()).unwrap(), ObjVersion::default());

    // The content digests, from the stored checksums, are those of the bytes.
    let mut a_bytes = vec![0u8; OBJ as usize];
    a_bytes[..BS].copy_from_slice(&pattern(0xa1, BS));
    a_bytes[BS + 10..BS + 110].copy_from_slice(&pattern(0xb2, 100));
    let fresh = tempfile::tempdir().unwrap();
    let t = FileStore::open(fresh.path(), OBJ).unwrap();
    t.write(a(), 0, &a_bytes).unwrap();
    assert_eq!(
        s.content_crc(a(), OBJ as u32).unwrap(),
        t.content_crc(a(), OBJ as u32).unwrap()
    );
}

#[test]
fn test_this_build_writes_the_same_files_as_the_last_release() {
    let dir = tempfile::tempdir().unwrap();
    write_the_store(dir.path());
    let ours = files(&dir.path().join("objects"));
    let theirs = files(&golden_dir().join("objects"));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "the same tree of files"
    );
    for (rel, bytes) in &theirs {
        assert!(ours[rel] == *bytes, "{} differs", rel.display());
    }
}

/// Writes the golden store to `$DROVE_GOLDEN_OUT` (run in a checkout of the
/// release whose format is kept; see the top of this file).
#[test]
#[ignore]
fn write_golden_files() {
    let out = std::env::var("DROVE_GOLDEN_OUT").expect("set DROVE_GOLDEN_OUT to a new directory");
    let out = PathBuf::from(out);
    fs::create_dir_all(&out).unwrap();
    write_the_store(&out);
}
