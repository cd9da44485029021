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
    /// An object's worth of zeros, which every read is a slice of (allocated once,
    /// and never written: the memory is the kernel's zero pages until touched).
    zeros: bytes::Bytes,
}

impl SizeStore {
    /// An empty store of objects of `object_size` bytes.
    pub fn new(object_size: u64) -> SizeStore {
        SizeStore {
            object_size,
            objects: Mutex::new(BTreeMap::new()),
            zeros: bytes::Bytes::from(vec![0; usize::try_from(object_size).unwrap_or(0)]),
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

    fn read_bytes(&self, oid: ObjectId, offset: u64, len: u32) -> Result<bytes::Bytes> {
        self.check(oid, offset, u64::from(len))?;
        // Reads return zeros, whatever the offset: any `len` bytes of them.
        Ok(self.zeros.slice(..len as usize))
    }

    fn content_crc(&self, oid: ObjectId, len: u32) -> Result<u32> {
        self.check(oid, 0, u64::from(len))?;
        Ok(drove_objstore::zeros_content_crc(len))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_reads_are_zeros_of_the_length_asked_and_stay_inside_the_object() {
        let s = SizeStore::new(1 << 20);
        let oid = ObjectId::new(VdiId(1), 0);
        for (off, len) in [(0u64, 4096u32), (4096, 1 << 19), (0, 1 << 20), (1 << 20, 0)] {
            let b = s.read_bytes(oid, off, len).unwrap();
            assert_eq!(b.len(), len as usize);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(b, s.read(oid, off, len).unwrap());
        }
        assert!(s.read_bytes(oid, 4096, 1 << 20).is_err());
        assert!(s.read_bytes(oid, u64::MAX, 1).is_err());
    }
}
