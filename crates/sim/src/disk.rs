//! A simulated node's disk: its object store and its recovery record
//! (`recovery.json`), and the boot of its host. The store is drove's `MemStore` on a
//! disk that lies ([`MemStore::lying`]): what was not flushed is lost at a power loss.
//! The record is written synced (as `CatchUp` writes `recovery.json`: fsync, then
//! rename), so it holds what was last saved, whatever the power does.
//!
//! Each run of the node's process gets a copy of the disk as the last run left it
//! ([`NodeDisk::after_crash`]): what a crashed process still had under way never
//! reaches the disk the next run reads.
use drove_objstore::MemStore;
use drove_replica::catchup::Record;
use parking_lot::Mutex;
use std::sync::Arc;

/// One node's disk, as one run of its process sees it.
pub struct NodeDisk {
    /// The objects.
    pub mem: Arc<MemStore>,
    /// The recovery record as it lies on the disk.
    record: Arc<Mutex<Option<Vec<u8>>>>,
    /// Boots of the host so far (a power loss boots it anew).
    pub boot: u64,
}

impl NodeDisk {
    /// A fresh, empty disk for objects of `object_size` bytes.
    pub fn new(object_size: u64) -> NodeDisk {
        NodeDisk {
            mem: Arc::new(MemStore::lying(object_size)),
            record: Arc::default(),
            boot: 1,
        }
    }

    /// The disk as the next run of the process finds it after this one died: what
    /// it held, flushed or in the page cache (the host still runs).
    pub fn after_crash(&self) -> NodeDisk {
        NodeDisk {
            mem: Arc::new(self.mem.copy_disk()),
            record: Arc::new(Mutex::new(self.record.lock().clone())),
            boot: self.boot,
        }
    }

    /// The host lost power: what was not flushed is gone, but for a part the
    /// kernel had written back on its own, torn at block granularity (`chance`
    /// draws which); the host boots anew. The objects that had unflushed changes.
    pub fn power_loss(&mut self, chance: &mut dyn FnMut(f64) -> bool) -> usize {
        self.boot += 1;
        self.mem.power_loss(chance)
    }

    /// The recovery record, for this run of the node.
    pub fn record(&self) -> Box<dyn Record> {
        Box::new(SimRecord(self.record.clone()))
    }

    /// The boot id the host gives (Linux's `/proc/sys/kernel/random/boot_id`).
    pub fn boot_id(&self) -> String {
        format!("sim-boot-{}", self.boot)
    }
}

/// The recovery record on a simulated disk.
struct SimRecord(Arc<Mutex<Option<Vec<u8>>>>);

impl Record for SimRecord {
    fn load(&self) -> Option<Vec<u8>> {
        self.0.lock().clone()
    }

    fn save(&self, bytes: &[u8]) -> std::io::Result<()> {
        *self.0.lock() = Some(bytes.to_vec());
        Ok(())
    }
}
