//! A model disk for runs that measure time, not data (`sim paper`, `sim dc-loss`):
//! it keeps which objects exist and their versions, and no bytes; every read
//! returns zeros. Writing 1 MiB costs nothing here, so a run at the paper's scale
//! does not spend its time copying gigabytes in memory; what a disk costs is the
//! network's per-node queue ([`crate::net::SimNet`]). The fault runs, which check
//! data, use drove's `MemStore`.
use drove_objstore::{ObjectStore, Usage};
use drove_types::{Error, ObjVersion, ObjectId, Result, VdiId};
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// Objects and versions, no data.
pub struct SizeStore {
    object_size: u64,
    objects: Mutex<BTreeMap<ObjectId, ObjVersion>>,
}

impl SizeStore {
    /// An empty store of objects of `object_size` bytes.
    pub fn new(object_size: u64) -> SizeStore {
        SizeStore {
            object_size,
            objects: Mutex::new(BTreeMap::new()),
        }
    }

    fn check(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.object_size => Ok(()),
            _ => Err(Error::invalid(format!(
                "Range {offset}+{len} is outside object {oid}"
            ))),
        }
    }

    fn touch(&self, oid: ObjectId) {
        self.objects.lock().entry(oid).or_default();
    }
}

impl ObjectStore for SizeStore {
    fn read(&self, oid: ObjectId, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.check(oid, offset, u64::from(len))?;
        Ok(vec![0; len as usize])
    }

    fn write(&self, oid: ObjectId, offset: u64, data: &[u8]) -> Result<()> {
        self.check(oid, offset, data.len() as u64)?;
        self.touch(oid);
        Ok(())
    }

    fn create(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<()> {
        self.check(oid, 0, data.len() as u64)?;
        self.objects.lock().insert(oid, version);
        Ok(())
    }

    fn replace(&self, oid: ObjectId, data: &[u8], version: ObjVersion) -> Result<u64> {
        self.create(oid, data, version)?;
        Ok(data.len() as u64)
    }

    fn write_zeroes(&self, oid: ObjectId, offset: u64, len: u64) -> Result<()> {
        self.check(oid, offset, len)?;
        self.touch(oid);
        Ok(())
    }

    fn flush(&self, _oids: &[ObjectId]) -> Result<()> {
        Ok(())
    }

    fn version(&self, oid: ObjectId) -> Result<ObjVersion> {
        Ok(self.objects.lock().get(&oid).copied().unwrap_or_default())
    }

    fn set_version(&self, oid: ObjectId, version: ObjVersion) -> Result<()> {
        self.objects.lock().insert(oid, version);
        Ok(())
    }

    fn exists(&self, oid: ObjectId) -> Result<bool> {
        Ok(self.objects.lock().contains_key(&oid))
    }

    fn delete(&self, oid: ObjectId) -> Result<()> {
        self.objects.lock().remove(&oid);
        Ok(())
    }

    fn list(&self) -> Result<Vec<ObjectId>> {
        Ok(self.objects.lock().keys().copied().collect())
    }

    fn used_bytes(&self) -> Result<u64> {
        Ok(self.objects.lock().len() as u64 * self.object_size)
    }

    fn usage(&self) -> Result<BTreeMap<VdiId, Usage>> {
        let mut out: BTreeMap<VdiId, Usage> = BTreeMap::new();
        for oid in self.objects.lock().keys() {
            let u = out.entry(oid.vdi).or_default();
            u.objects += 1;
            u.bytes += self.object_size;
        }
        Ok(out)
    }

    fn never_blocks(&self) -> bool {
        true
    }
}
