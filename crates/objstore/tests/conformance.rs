//! The behaviour every `ObjectStore` must have, run against `FileStore` and `MemStore`:
//! round trips at many offsets, holes, zeroing, existence, range checks and
//! concurrent I/O to one object.
use drove_objstore::{FileStore, MemStore, ObjectStore};
use drove_types::{ErrorKind, ObjVersion, ObjectId, VdiId};
use std::sync::Arc;

const OBJ: u64 = 4 << 20;
const BS: u64 = 4096;

fn oid(vdi: u32, index: u32) -> ObjectId {
    ObjectId::new(VdiId(vdi), index)
}

/// Bytes that differ at every position and between calls with another `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn round_trips_at_many_offsets(s: &dyn ObjectStore) {
    let cases: &[(u64, usize)] = &[
        (0, 4096),
        (4096, 4096),
        (1, 1),
        (4095, 2),
        (100, 5000),
        (8191, 8194),
        (3 * BS + 17, 3 * 4096 + 100),
        (OBJ - 4096, 4096),
        (OBJ - 1, 1),
        (OBJ - 10_000, 10_000),
        (1 << 20, 1 << 20),
    ];
    for (i, &(off, len)) in cases.iter().enumerate() {
        let o = oid(1, i as u32);
        let data = pattern(i as u8, len);
        s.write(o, off, &data).unwrap();
        assert_eq!(s.read(o, off, len as u32).unwrap(), data, "case {i}");
        // Bytes just around the write were never written.
        if off > 0 {
            assert_eq!(s.read(o, off - 1, 1).unwrap(), vec![0], "case {i}");
        }
        if off + (len as u64) < OBJ {
            assert_eq!(s.read(o, off + len as u64, 1).unwrap(), vec![0], "case {i}");
        }
    }
    // Overlapping writes: the later one wins only where it wrote.
    let o = oid(2, 0);
    s.write(o, 0, &pattern(1, 3 * 4096)).unwrap();
    s.write(o, 4000, &pattern(2, 200)).unwrap();
    let mut want = pattern(1, 3 * 4096);
    want[4000..4200].copy_from_slice(&pattern(2, 200));
    assert_eq!(s.read(o, 0, 3 * 4096).unwrap(), want);
    assert_eq!(s.read(o, 3999, 202).unwrap(), want[3999..4201]);
}

fn versions_follow_set_and_create(s: &dyn ObjectStore) {
    let v = |generation, epoch| ObjVersion { generation, epoch };
    let o = oid(9, 0);
    // A missing object has version zero, and setting one does not create it.
    assert_eq!(s.version(o).unwrap(), v(0, 0));
    s.set_version(o, v(3, 4)).unwrap();
    assert!(!s.exists(o).unwrap());
    assert_eq!(s.version(o).unwrap(), v(0, 0));
    // Written, then versioned; a later write leaves the version alone.
    s.write(o, 4096, &pattern(1, 4096)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(0, 0));
    s.set_version(o, v(3, 4)).unwrap();
    s.write(o, 0, &pattern(2, 100)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(3, 4));
    // Set exactly, not raised: a recovered copy takes its source's version.
    s.set_version(o, v(2, 9)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(2, 9));
    assert_eq!(s.read(o, 4096, 4096).unwrap(), pattern(1, 4096));
    // Zeroing the whole object keeps its version; create replaces it.
    s.write_zeroes(o, 0, OBJ).unwrap();
    assert_eq!(s.version(o).unwrap(), v(2, 9));
    s.create(o, &pattern(3, 8192), v(5, 1)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(5, 1));
    assert_eq!(s.read(o, 0, 8192).unwrap(), pattern(3, 8192));
    // Deleted and written again: a new object, version zero.
    s.delete(o).unwrap();
    s.write(o, 0, &pattern(4, 4096)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(0, 0));
    // A client write sets both, in one call; an empty one only the version.
    s.write_versioned(o, 4096, &pattern(5, 10), v(6, 7))
        .unwrap();
    assert_eq!(s.version(o).unwrap(), v(6, 7));
    assert_eq!(s.read(o, 4096, 10).unwrap(), pattern(5, 10));
    s.write_versioned(o, 0, &[], v(6, 8)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(6, 8));
    let missing = oid(9, 1);
    s.write_versioned(missing, 0, &[], v(6, 8)).unwrap();
    assert!(!s.exists(missing).unwrap());
    // A write never takes the version back: one made earlier that arrives later
    // (zone-sync writes reach a far copy out of order) keeps the later version,
    // and its bytes still land. A write of a later generation raises it.
    s.write_versioned(o, 0, &pattern(6, 10), v(6, 5)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(6, 8));
    assert_eq!(s.read(o, 0, 10).unwrap(), pattern(6, 10));
    s.write_versioned(o, 0, &[], v(5, 99)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(6, 8));
    s.raise_version(o, v(6, 2)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(6, 8));
    s.write_versioned(o, 0, &pattern(7, 10), v(7, 1)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(7, 1));
    s.raise_version(missing, v(9, 9)).unwrap();
    assert!(!s.exists(missing).unwrap());
    // Recovery's exact set still goes back.
    s.set_version(o, v(6, 3)).unwrap();
    assert_eq!(s.version(o).unwrap(), v(6, 3));
}

fn holes_and_missing_objects_read_as_zeros(s: &dyn ObjectStore) {
    assert_eq!(s.read(oid(3, 0), 12345, 9000).unwrap(), vec![0u8; 9000]);
    assert!(!s.exists(oid(3, 0)).unwrap(), "reading must not create");
    let o = oid(3, 1);
    s.write(o, 2 << 20, &[5u8; 4096]).unwrap();
    assert_eq!(s.read(o, 0, 1 << 20).unwrap(), vec![0u8; 1 << 20]);
    assert_eq!(s.read(o, (2 << 20) + 4096, 8192).unwrap(), vec![0u8; 8192]);
    assert_eq!(s.read(o, (2 << 20) - 2, 4).unwrap(), vec![0, 0, 5, 5]);
    assert_eq!(s.read(o, 0, 0).unwrap(), Vec::<u8>::new());
}

fn zeroes_read_as_zeros(s: &dyn ObjectStore) {
    let o = oid(4, 0);
    let data = pattern(9, 16 * 4096);
    s.write(o, 0, &data).unwrap();
    // Partial head, whole middle, partial tail.
    s.write_zeroes(o, 1000, 5 * 4096).unwrap();
    // Inside one block.
    s.write_zeroes(o, 10 * 4096 + 10, 20).unwrap();
    // Exactly one whole block.
    s.write_zeroes(o, 12 * 4096, 4096).unwrap();
    let mut want = data.clone();
    want[1000..1000 + 5 * 4096].fill(0);
    want[10 * 4096 + 10..10 * 4096 + 30].fill(0);
    want[12 * 4096..13 * 4096].fill(0);
    assert_eq!(s.read(o, 0, 16 * 4096).unwrap(), want);
    // Writing over a zeroed range works as over a hole.
    s.write(o, 4096, &[3u8; 100]).unwrap();
    want[4096..4196].fill(3);
    assert_eq!(s.read(o, 0, 16 * 4096).unwrap(), want);
    // Zeroing a missing object does not create it; zeroing past the written end
    // of an existing one is fine.
    s.write_zeroes(oid(4, 1), 0, OBJ).unwrap();
    assert!(!s.exists(oid(4, 1)).unwrap());
    s.write_zeroes(o, 0, OBJ).unwrap();
    assert_eq!(s.read(o, 0, 16 * 4096).unwrap(), vec![0u8; 16 * 4096]);
    assert!(s.exists(o).unwrap(), "zeroing keeps the object");
}

fn exists_delete_and_list(s: &dyn ObjectStore) {
    let a = oid(5, 0);
    let b = oid(5, 70_000);
    let c = oid(0xffff_ffff, u32::MAX);
    assert!(s.list().unwrap().is_empty());
    for o in [a, b, c] {
        assert!(!s.exists(o).unwrap());
        s.write(o, 0, &[1]).unwrap();
        assert!(s.exists(o).unwrap());
    }
    let mut listed = s.list().unwrap();
    listed.sort();
    assert_eq!(listed, vec![a, b, c]);
    s.delete(b).unwrap();
    s.delete(b).unwrap();
    s.delete(oid(6, 6)).unwrap();
    assert!(!s.exists(b).unwrap());
    assert_eq!(s.read(b, 0, 1).unwrap(), vec![0]);
    let mut listed = s.list().unwrap();
    listed.sort();
    assert_eq!(listed, vec![a, c]);
    // A deleted object comes back empty, not with its old content.
    s.write(b, 4096, &[2]).unwrap();
    assert_eq!(s.read(b, 0, 1).unwrap(), vec![0]);
    assert_eq!(s.read(b, 4096, 1).unwrap(), vec![2]);
    // A zero-length write checks its range but creates nothing.
    s.write(oid(7, 0), 100, &[]).unwrap();
    assert!(!s.exists(oid(7, 0)).unwrap());
    s.flush(&[]).unwrap();
    s.flush(&[a, oid(8, 8)]).unwrap();
}

fn out_of_range_is_invalid(s: &dyn ObjectStore) {
    let o = oid(9, 0);
    let kind = |r: drove_types::Result<()>| r.unwrap_err().kind();
    assert_eq!(kind(s.write(o, OBJ - 1, &[1, 2])), ErrorKind::Invalid);
    assert_eq!(kind(s.write(o, OBJ, &[1])), ErrorKind::Invalid);
    assert_eq!(kind(s.write(o, u64::MAX, &[1])), ErrorKind::Invalid);
    assert_eq!(s.read(o, OBJ, 1).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(
        s.read(o, u64::MAX - 1, 4).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    assert_eq!(kind(s.write_zeroes(o, 4096, OBJ)), ErrorKind::Invalid);
    assert_eq!(kind(s.write_zeroes(o, 1, u64::MAX)), ErrorKind::Invalid);
    assert!(!s.exists(o).unwrap());
    s.write(o, OBJ - 1, &[1]).unwrap();
}

/// 8 threads write the same object: whole blocks of their own, and 512-byte slices
/// of shared blocks (each a read-modify-write of the same checksum), while readers
/// read the shared blocks. Nothing is lost and no reader sees a torn block.
fn concurrent_writers_to_one_object_all_land(s: Arc<dyn ObjectStore>) {
    let o = oid(10, 0);
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 50;
    const SHARED: u64 = 4; // blocks 0..4 are shared, split in 8 slices of 512 bytes
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    s.read(o, 0, (SHARED * BS) as u32).unwrap();
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for r in 0..ROUNDS {
                    let own = SHARED + t * ROUNDS + r;
                    s.write(o, own * BS, &pattern((t * 7 + r) as u8, 4096))
                        .unwrap();
                    for b in 0..SHARED {
                        s.write(o, b * BS + t * 512, &[(t + r) as u8 + 1; 512])
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    for t in 0..THREADS {
        for r in 0..ROUNDS {
            let own = SHARED + t * ROUNDS + r;
            let got = s.read(o, own * BS, 4096).unwrap();
            assert_eq!(
                got,
                pattern((t * 7 + r) as u8, 4096),
                "thread {t} round {r}"
            );
        }
        for b in 0..SHARED {
            let got = s.read(o, b * BS + t * 512, 512).unwrap();
            assert_eq!(
                got,
                vec![(t + ROUNDS - 1) as u8 + 1; 512],
                "thread {t} block {b}"
            );
        }
    }
}

/// A whole object with runs of data and of zero blocks, at a page-aligned address
/// (`FileStore` then writes it with direct I/O) and at an unaligned one.
fn replace_writes_the_whole_object_and_its_version(s: &dyn ObjectStore) {
    let v = |generation, epoch| ObjVersion { generation, epoch };
    let o = oid(11, 0);
    let mut content = pattern(7, OBJ as usize);
    for b in [0u64, 1, 5, 6, 7, 1000, 1023] {
        content[(b * BS) as usize..((b + 1) * BS) as usize].fill(0);
    }
    let mut backing = vec![0u8; OBJ as usize + 2 * BS as usize];
    let at = (BS as usize - backing.as_ptr() as usize % BS as usize) % BS as usize;
    for (start, version) in [(at, v(1, 2)), (at + 1, v(3, 4))] {
        s.write(o, 0, &pattern(9, 3 * 4096)).unwrap();
        s.set_version(o, v(8, 8)).unwrap();
        let buf = &mut backing[start..start + OBJ as usize];
        buf.copy_from_slice(&content);
        let stored = s.replace(o, buf, version).unwrap();
        assert_eq!(stored, OBJ - 7 * BS, "zero blocks are not stored");
        assert_eq!(s.version(o).unwrap(), version);
        assert_eq!(s.read(o, 0, OBJ as u32).unwrap(), content, "start {start}");
        s.flush(&[]).unwrap();
        assert_eq!(s.read(o, 0, OBJ as u32).unwrap(), content, "start {start}");
    }
    // All zeros: the object still exists, and reads as zeros.
    s.replace(o, &vec![0u8; OBJ as usize], v(5, 5)).unwrap();
    assert!(s.exists(o).unwrap());
    assert_eq!(s.version(o).unwrap(), v(5, 5));
    assert_eq!(s.read(o, 0, 8192).unwrap(), vec![0u8; 8192]);
    // A partial write afterwards checks against the checksums replace stored.
    s.replace(o, &content, v(6, 6)).unwrap();
    s.write(o, 8 * BS + 100, &[0xEE; 10]).unwrap();
    let mut want = content[(8 * BS) as usize..(9 * BS) as usize].to_vec();
    want[100..110].fill(0xEE);
    assert_eq!(s.read(o, 8 * BS, 4096).unwrap(), want);
    // Past the object size: refused.
    assert_eq!(
        s.replace(o, &vec![1u8; OBJ as usize + 1], v(7, 7))
            .unwrap_err()
            .kind(),
        ErrorKind::Invalid
    );
    assert_eq!(
        s.read(o, 8 * BS, 4096).unwrap(),
        want,
        "refused, left as it was"
    );
}

/// The content digest from the store's checksums is the one computed from the
/// data read back, through writes, zeroing, replacing and deleting; copies with
/// the same bytes have the same digest, whatever way the bytes came.
fn content_digest_follows_the_data(s: &dyn ObjectStore) {
    let len = OBJ as u32;
    let check = |o: ObjectId, what: &str| {
        let data = s.read(o, 0, len).unwrap();
        assert_eq!(
            s.content_crc(o, len).unwrap(),
            drove_objstore::content_crc(&data),
            "{what}"
        );
    };
    let (a, b) = (oid(9, 0), oid(9, 1));
    assert_eq!(
        s.content_crc(a, len).unwrap(),
        drove_objstore::zeros_content_crc(len),
        "a missing object digests as zeros"
    );
    s.write(a, 5 * BS + 7, &pattern(3, 9000)).unwrap();
    check(a, "after a write");
    s.write_zeroes(a, 6 * BS, 2 * BS).unwrap();
    check(a, "after zeroing");
    // The same bytes reached another way: a replace of what a reads.
    let data = s.read(a, 0, len).unwrap();
    s.replace(b, &data, ObjVersion::default()).unwrap();
    assert_eq!(
        s.content_crc(a, len).unwrap(),
        s.content_crc(b, len).unwrap()
    );
    s.write(b, OBJ - 1, &[1]).unwrap();
    assert_ne!(
        s.content_crc(a, len).unwrap(),
        s.content_crc(b, len).unwrap(),
        "one byte differs"
    );
    // Zeros written are zeros: an object of zeros digests as a missing one.
    s.write(a, 0, &vec![0u8; OBJ as usize]).unwrap();
    assert_eq!(
        s.content_crc(a, len).unwrap(),
        drove_objstore::zeros_content_crc(len)
    );
    s.delete(b).unwrap();
    check(b, "after a delete");
    // A prefix is digested as such.
    s.write(a, 0, &pattern(4, 8192)).unwrap();
    let head = s.read(a, 0, 8192).unwrap();
    assert_eq!(
        s.content_crc(a, 8192).unwrap(),
        drove_objstore::content_crc(&head)
    );
    assert_eq!(
        s.content_crc(a, len + 1).unwrap_err().kind(),
        ErrorKind::Invalid
    );
}

macro_rules! conformance {
    ($make:expr) => {
        #[test]
        fn test_content_digest_follows_the_data() {
            let (_guard, s) = $make;
            super::content_digest_follows_the_data(&s);
        }
        #[test]
        fn test_replace_writes_the_whole_object_and_its_version() {
            let (_guard, s) = $make;
            super::replace_writes_the_whole_object_and_its_version(&s);
        }
        #[test]
        fn test_round_trips_at_many_offsets() {
            let (_guard, s) = $make;
            super::round_trips_at_many_offsets(&s);
        }
        #[test]
        fn test_holes_and_missing_objects_read_as_zeros() {
            let (_guard, s) = $make;
            super::holes_and_missing_objects_read_as_zeros(&s);
        }
        #[test]
        fn test_zeroes_read_as_zeros() {
            let (_guard, s) = $make;
            super::zeroes_read_as_zeros(&s);
        }
        #[test]
        fn test_exists_delete_and_list() {
            let (_guard, s) = $make;
            super::exists_delete_and_list(&s);
        }
        #[test]
        fn test_versions_follow_set_and_create() {
            let (_guard, s) = $make;
            super::versions_follow_set_and_create(&s);
        }
        #[test]
        fn test_out_of_range_is_invalid() {
            let (_guard, s) = $make;
            super::out_of_range_is_invalid(&s);
        }
        #[test]
        fn test_concurrent_writers_to_one_object_all_land() {
            let (_guard, s) = $make;
            super::concurrent_writers_to_one_object_all_land(std::sync::Arc::new(s));
        }
    };
}

mod file {
    use super::*;
    conformance!({
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::open(dir.path(), OBJ).unwrap();
        (dir, s)
    });
}

mod mem {
    use super::*;
    conformance!(((), MemStore::new(OBJ)));
}
