//! [`MemDisk`]: the metadata's redb file kept in memory, for the simulator. redb
//! reads and writes its file through [`redb::StorageBackend`]; this one keeps the
//! bytes in a buffer the simulated node owns, so the node's log, vote and snapshot
//! live on its simulated disk: a crash keeps what was written ([`MemDisk::copy`] at
//! the crash is the disk the restarted node opens), and nothing is shared with the
//! dead run, whose tasks may still be winding down.
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

/// A metadata disk in memory, shared by the handles cloned from it.
#[derive(Debug, Clone, Default)]
pub struct MemDisk {
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    /// A separate disk holding what this one holds now (the disk as a crash
    /// leaves it: every write redb made is durable here, as after its fsync).
    pub fn copy(&self) -> MemDisk {
        MemDisk {
            bytes: Arc::new(Mutex::new(self.bytes.lock().clone())),
        }
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.lock().len() as u64
    }

    /// Whether nothing was ever written.
    pub fn is_empty(&self) -> bool {
        self.bytes.lock().is_empty()
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
        let bytes = self.bytes.lock();
        let r = range(offset, out.len(), bytes.len())?;
        out.copy_from_slice(&bytes[r]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.bytes.lock().resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut bytes = self.bytes.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start
            .checked_add(data.len())
            .ok_or_else(|| io::Error::other("write past the address space"))?;
        if end > bytes.len() {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
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
}
