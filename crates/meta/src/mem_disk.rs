//! [`MemDisk`]: the metadata's redb file kept in memory, for the simulator. redb
//! reads and writes its file through [`redb::StorageBackend`]; this one keeps the
//! bytes in a buffer the simulated node owns, so the node's log, vote and snapshot
//! live on its simulated disk: a crash keeps what was written ([`MemDisk::copy`] at
//! the crash is the disk the restarted node opens), and nothing is shared with the
//! dead run, whose tasks may still be winding down. A power loss
//! ([`MemDisk::power_loss`]) keeps only what redb synced, plus a random part of
//! what it wrote since, torn at sector granularity, as a real disk would.
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

/// The granularity at which a power loss tears a file: a disk writes a sector
/// whole or not at all, but a write of several sectors may stop between them.
const SECTOR: usize = 512;

/// The chance that a sector written but not synced reached the disk anyway (the
/// kernel writes dirty pages back on its own) when the power goes.
const WRITTEN_BACK: f64 = 0.3;

/// A metadata disk in memory, shared by the handles cloned from it.
#[derive(Debug, Clone, Default)]
pub struct MemDisk {
    inner: Arc<Mutex<Inner>>,
}

/// What the file holds as the process sees it (`bytes`, the page cache), and what
/// the disk holds for sure: `durable` as of the last `sync_data`, and the sectors
/// written since (`dirty`), which a power loss may keep, drop or tear.
#[derive(Debug, Clone, Default)]
struct Inner {
    bytes: Vec<u8>,
    durable: Vec<u8>,
    dirty: BTreeSet<usize>,
}

impl Inner {
    /// Settle every sector written since the last sync: those `reached` takes
    /// (by their byte range) reach the disk, the others are lost. How many were
    /// lost.
    fn settle(&mut self, mut reached: impl FnMut(&std::ops::Range<usize>) -> bool) -> usize {
        let mut lost = 0;
        for s in std::mem::take(&mut self.dirty) {
            let r = s * SECTOR..((s + 1) * SECTOR).min(self.bytes.len());
            if reached(&r) {
                self.durable[r.clone()].copy_from_slice(&self.bytes[r]);
            } else {
                lost += 1;
            }
        }
        lost
    }
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    /// A separate disk holding what this one holds now: the disk as a crash of
    /// the process leaves it (the page cache survives; what was not synced is
    /// still at risk of a later [`MemDisk::power_loss`]).
    pub fn copy(&self) -> MemDisk {
        MemDisk {
            inner: Arc::new(Mutex::new(self.inner.lock().clone())),
        }
    }

    /// The host loses power: the file keeps what was synced, plus each sector
    /// written since with the chance `chance(WRITTEN_BACK)` draws (so a write of
    /// several sectors may be torn). Its length is the synced one. Returns how
    /// many written sectors were lost.
    pub fn power_loss(&self, chance: &mut dyn FnMut(f64) -> bool) -> usize {
        let mut d = self.inner.lock();
        let durable_len = d.durable.len();
        let lost = d.settle(|r| r.end <= durable_len && chance(WRITTEN_BACK));
        d.bytes = d.durable.clone();
        lost
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.inner.lock().bytes.len() as u64
    }

    /// Whether nothing was ever written.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().bytes.is_empty()
    }
}

fn range(offset: u64, n: usize, len: usize) -> io::Result<std::ops::Range<usize>> {
    let start = usize::try_from(offset).map_err(io::Error::other)?;
    let end = start
        .checked_add(n)
        .filter(|&e| e <= len)
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
    Ok(start..end)
}

impl redb::StorageBackend for MemDisk {
    fn len(&self) -> io::Result<u64> {
        Ok(MemDisk::len(self))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let d = self.inner.lock();
        let r = range(offset, out.len(), d.bytes.len())?;
        out.copy_from_slice(&d.bytes[r]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        let mut d = self.inner.lock();
        d.bytes.resize(len, 0);
        // A shrink drops the sectors past the end; a grow is zeros until synced.
        let past = len.div_ceil(SECTOR);
        d.dirty.split_off(&past);
        Ok(())
    }

    /// Make what was written durable (fdatasync: data and the file's length).
    fn sync_data(&self) -> io::Result<()> {
        let mut d = self.inner.lock();
        let len = d.bytes.len();
        d.durable.resize(len, 0);
        d.settle(|_| true);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut d = self.inner.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start
            .checked_add(data.len())
            .ok_or_else(|| io::Error::other("write past the address space"))?;
        if end > d.bytes.len() {
            d.bytes.resize(end, 0);
        }
        d.bytes[start..end].copy_from_slice(data);
        if end > start {
            d.dirty.extend(start / SECTOR..end.div_ceil(SECTOR));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::StorageBackend;

    #[test]
    fn test_a_copy_keeps_what_was_written_and_goes_its_own_way() {
        let d = MemDisk::new();
        d.write(4, b"vote").unwrap();
        assert_eq!(StorageBackend::len(&d).unwrap(), 8);
        let c = d.copy();
        d.write(0, b"gone").unwrap();
        let mut out = [0u8; 8];
        c.read(0, &mut out).unwrap();
        assert_eq!(&out, b"\0\0\0\0vote");
        assert!(c.read(6, &mut out).is_err());
    }

    #[test]
    fn test_a_power_loss_keeps_what_was_synced_and_tears_the_rest() {
        let d = MemDisk::new();
        d.write(0, &[1u8; 2048]).unwrap();
        d.sync_data().unwrap();
        d.write(0, &[2u8; 2048]).unwrap();
        d.write(2048, &[3u8; 512]).unwrap();
        // Nothing written back: the synced bytes and length only.
        let c = d.copy();
        assert_eq!(c.power_loss(&mut |_| false), 5);
        assert_eq!(c.len(), 2048);
        let mut out = [0u8; 2048];
        c.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 1));
        // Every other sector written back: torn, the grown tail gone all the same.
        let mut n = 0;
        let c = d.copy();
        assert_eq!(
            c.power_loss(&mut |_| {
                n += 1;
                n % 2 == 1
            }),
            3
        );
        c.read(0, &mut out).unwrap();
        let sectors: Vec<u8> = out.chunks(SECTOR).map(|s| s[0]).collect();
        assert_eq!(sectors, [2, 1, 2, 1]);
        assert_eq!(c.len(), 2048);
        // The original is untouched, and a sync makes everything stay.
        d.sync_data().unwrap();
        assert_eq!(d.power_loss(&mut |_| false), 0);
        assert_eq!(d.len(), 2560);
    }

    /// A disk whose host loses power after `left` more writes or syncs: every
    /// call after fails, and `at` is the disk as the power loss found it.
    #[derive(Debug, Clone)]
    struct Doomed {
        disk: MemDisk,
        left: Arc<std::sync::atomic::AtomicU64>,
        at: Arc<Mutex<Option<MemDisk>>>,
    }

    impl Doomed {
        fn step(&self) -> io::Result<()> {
            use std::sync::atomic::Ordering::SeqCst;
            let left = self.left.load(SeqCst);
            if left == 0 {
                self.at.lock().get_or_insert_with(|| self.disk.copy());
                return Err(io::Error::other("the power is off"));
            }
            self.left.store(left - 1, SeqCst);
            Ok(())
        }
    }

    impl StorageBackend for Doomed {
        fn len(&self) -> io::Result<u64> {
            Ok(self.disk.len())
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            self.disk.read(offset, out)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.step()?;
            self.disk.set_len(len)
        }
        fn sync_data(&self) -> io::Result<()> {
            self.step()?;
            self.disk.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            self.step()?;
            self.disk.write(offset, data)
        }
    }

    /// redb on this disk keeps every durable commit through a power loss at any
    /// write or sync, a commit's own included: the promise the Raft log and vote
    /// rest on (and a check that this disk loses only what a real one may).
    #[test]
    fn test_redb_keeps_every_durable_commit_through_power_losses() {
        use redb::{Database, ReadableDatabase, TableDefinition};
        use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
        const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");
        let value = |k: u64| vec![k as u8; 700 + (k as usize * 997) % 9000];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rng = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut disk = MemDisk::new();
        // Keys below `durable` were committed durably (a durable commit makes the
        // ones before it durable too).
        let (mut durable, mut lost, mut torn_commits) = (0u64, 0usize, 0);
        for _ in 0..80 {
            let doomed = Doomed {
                disk: disk.clone(),
                left: Arc::new(AtomicU64::new(u64::MAX)),
                at: Arc::new(Mutex::new(None)),
            };
            let db = Database::builder()
                .create_with_backend(doomed.clone())
                .unwrap();
            if durable > 0 {
                let r = db.begin_read().unwrap();
                let t = r.open_table(T).unwrap();
                for k in 0..durable {
                    let v = t.get(k).unwrap().expect("a durable commit was lost");
                    assert_eq!(v.value(), &value(k)[..], "key {k}");
                }
            }
            doomed.left.store(rng() % 60, SeqCst);
            let mut next = durable;
            while doomed.at.lock().is_none() {
                let Ok(mut w) = db.begin_write() else { break };
                let sync = rng() % 3 != 0;
                if !sync {
                    w.set_durability(redb::Durability::None).unwrap();
                }
                let put = w.open_table(T).and_then(|mut t| {
                    t.insert(next, &value(next)[..])
                        .map(|_| ())
                        .map_err(Into::into)
                });
                if put.is_err() {
                    break;
                }
                match w.commit() {
                    Ok(()) => {
                        next += 1;
                        if sync {
                            durable = next;
                        }
                    }
                    Err(_) => {
                        torn_commits += 1;
                        break;
                    }
                }
            }
            drop(db);
            let at = doomed
                .at
                .lock()
                .take()
                .unwrap_or_else(|| doomed.disk.copy());
            lost += at.power_loss(&mut |p| (rng() % 1000) as f64 / 1000.0 < p);
            disk = at;
        }
        assert!(lost > 0 && torn_commits > 0, "no power loss tore a commit");
    }
}
