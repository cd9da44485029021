//! Property test: random writes, zeroes, reads, deletes, flushes (and, for the
//! `FileStore`, reopens) behave like a map of plain byte vectors.
use drove_objstore::{FileStore, MemStore, ObjectStore};
use drove_types::{ObjectId, VdiId};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Small objects (16 blocks) so that random ranges often overlap and cross blocks.
const OBJ: u64 = 64 * 1024;
const BS: u64 = 4096;

#[derive(Debug, Clone)]
enum Op {
    Write {
        obj: u8,
        off: u64,
        len: u64,
        seed: u8,
    },
    Zero {
        obj: u8,
        off: u64,
        len: u64,
    },
    Read {
        obj: u8,
        off: u64,
        len: u64,
    },
    Delete {
        obj: u8,
    },
    Flush,
    Reopen,
}

/// An offset, often on or next to a block boundary.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..OBJ / BS).prop_map(|b| b * BS),
        (1..OBJ / BS, -3i64..=3).prop_map(|(b, d)| (b * BS).saturating_add_signed(d)),
        0..OBJ,
    ]
}

/// A range inside the object.
fn range() -> impl Strategy<Value = (u64, u64)> {
    (offset(), prop_oneof![1..=BS, Just(BS), 1..=3 * BS, 1..=OBJ]).prop_map(|(off, len)| {
        let off = off.min(OBJ - 1);
        (off, len.min(OBJ - off))
    })
}

fn op() -> impl Strategy<Value = Op> {
    let obj = 0u8..3;
    prop_oneof![
        6 => (obj.clone(), range(), any::<u8>())
            .prop_map(|(obj, (off, len), seed)| Op::Write { obj, off, len, seed }),
        3 => (obj.clone(), range()).prop_map(|(obj, (off, len))| Op::Zero { obj, off, len }),
        4 => (obj.clone(), range()).prop_map(|(obj, (off, len))| Op::Read { obj, off, len }),
        1 => obj.prop_map(|obj| Op::Delete { obj }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

fn oid(obj: u8) -> ObjectId {
    ObjectId::new(VdiId(7), u32::from(obj) * 1500)
}

fn bytes(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 253) as u8) | 1)
        .collect()
}

/// Run `ops` on a store and a model; `reopen` replaces the store (a no-op for stores
/// without persistence).
fn check(
    mut store: Box<dyn ObjectStore>,
    ops: &[Op],
    reopen: &dyn Fn(Box<dyn ObjectStore>) -> Box<dyn ObjectStore>,
) -> Result<(), TestCaseError> {
    let mut model: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Write {
                obj,
                off,
                len,
                seed,
            } => {
                let data = bytes(seed, len);
                store.write(oid(obj), off, &data).unwrap();
                let m = model.entry(obj).or_insert_with(|| vec![0; OBJ as usize]);
                m[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            Op::Zero { obj, off, len } => {
                store.write_zeroes(oid(obj), off, len).unwrap();
                if let Some(m) = model.get_mut(&obj) {
                    m[off as usize..(off + len) as usize].fill(0);
                }
            }
            Op::Read { obj, off, len } => {
                let got = store.read(oid(obj), off, len as u32).unwrap();
                let want = model.get(&obj).map_or(vec![0; len as usize], |m| {
                    m[off as usize..(off + len) as usize].to_vec()
                });
                prop_assert!(got == want, "step {step}: {op:?} read differs");
            }
            Op::Delete { obj } => {
                store.delete(oid(obj)).unwrap();
                model.remove(&obj);
            }
            Op::Flush => store.flush(&[]).unwrap(),
            Op::Reopen => store = reopen(store),
        }
    }
    let mut listed = store.list().unwrap();
    listed.sort();
    let want: Vec<_> = model.keys().map(|o| oid(*o)).collect();
    prop_assert_eq!(listed, want);
    for obj in 0..3u8 {
        prop_assert_eq!(store.exists(oid(obj)).unwrap(), model.contains_key(&obj));
        let got = store.read(oid(obj), 0, OBJ as u32).unwrap();
        let want = model
            .get(&obj)
            .cloned()
            .unwrap_or_else(|| vec![0; OBJ as usize]);
        prop_assert!(got == want, "object {obj} differs at the end");
    }
    Ok(())
}

fn open_file(dir: &Path) -> Box<dyn ObjectStore> {
    Box::new(FileStore::open(dir, OBJ).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn test_file_store_matches_model(ops in prop::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let reopen = move |old: Box<dyn ObjectStore>| {
            // The directory lock is released by the drop; without a flush, what
            // was written is still in the page cache and must read back the same.
            drop(old);
            open_file(&path)
        };
        check(open_file(dir.path()), &ops, &reopen)?;
    }

    #[test]
    fn test_mem_store_matches_model(ops in prop::collection::vec(op(), 1..60)) {
        check(Box::new(MemStore::new(OBJ)), &ops, &|s| s)?;
    }
}
