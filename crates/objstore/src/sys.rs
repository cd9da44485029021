//! The few system calls the object store needs beyond `std`: reads that treat the end
//! of a sparse file as zeros, hole punching, the file descriptor limit that sizes
//! the open-file cache and the free space of the disk.
//! Through rustix, which wraps each call safely; only `sync_file_range`, which it
//! does not wrap, goes to libc.
use rustix::io::Errno;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Zeros used to write zeros without allocating (hole-punch fallback, checksum entries).
pub(crate) static ZEROS: [u8; 64 * 1024] = [0u8; 64 * 1024];

/// Fill `buf` from `file` at `offset`; what lies past the end of the file reads as
/// zeros (an object file is only as long as its highest written byte).
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

/// Read `len` bytes of `file` at `offset` into a new buffer, without zero-filling it
/// first (a 4 MiB memset per object read showed up in recovery profiles); what lies
/// past the end of the file reads as zeros.
pub(crate) fn read_new_at(file: &File, len: usize, offset: u64) -> io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let at = offset + buf.len() as u64;
        // Reads into the spare capacity and grows the length by what was read.
        match rustix::io::pread(file, rustix::buffer::spare_capacity(&mut buf), at) {
            Ok(0) => break,
            Ok(_) => {}
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    buf.resize(len, 0);
    Ok(buf)
}

/// Start writing `file`'s dirty pages back to the disk without waiting for them
/// (a later fdatasync then has little left to do).
pub(crate) fn start_writeback(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a descriptor we own.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Memory and file alignment that direct I/O needs here (4 KiB: the block size, and
/// at least the logical sector size of any disk drove runs on).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// Whether `data` may be written with direct I/O: its address and length are whole
/// multiples of [`DIRECT_ALIGN`].
pub(crate) fn direct_ok(data: &[u8]) -> bool {
    (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) && data.len().is_multiple_of(DIRECT_ALIGN)
}

/// Open the existing file at `path` for direct (O_DIRECT) writes, which go from the
/// caller's memory to the disk without a copy into the page cache. `None` where the
/// file system does not support it (tmpfs).
pub(crate) fn open_direct(path: &std::path::Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Write `len` zero bytes at `offset`.
pub(crate) fn write_zeros_at(file: &File, mut offset: u64, mut len: u64) -> io::Result<()> {
    while len > 0 {
        let n = len.min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], offset)?;
        offset += n;
        len -= n;
    }
    Ok(())
}

/// Deallocate `[offset, offset + len)` so it reads as zeros and takes no space,
/// keeping the file size. Falls back to writing zeros on file systems without
/// hole punching.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use rustix::fs::FallocateFlags;
    if i64::try_from(offset).is_err() || i64::try_from(len).is_err() {
        return Err(Errno::INVAL.into());
    }
    loop {
        let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(file, mode, offset, len) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => {}
            Err(Errno::OPNOTSUPP) => return write_zeros_at(file, offset, len),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether every byte of `[offset, offset + len)` of `file` has blocks allocated
/// (no hole, not past the end): a write there needs no new space. `SEEK_HOLE`
/// finds the first hole at or after `offset` (the end of the file counts as one).
pub(crate) fn allocated(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(offset)) {
        Ok(hole) => Ok(hole >= offset.saturating_add(len)),
        // At or past the end of the file: nothing there is allocated.
        Err(Errno::NXIO) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `e` is EINVAL (a direct write the disk refused).
pub(crate) fn is_invalid(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::INVAL.raw_os_error())
}

/// The soft limit on open file descriptors (`None`: unlimited).
pub(crate) fn nofile_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Size and free space of a filesystem, in bytes, as `df` shows them: the size is
/// what is used plus what an unprivileged writer may still use (blocks reserved for
/// root count as neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpace {
    /// Used plus available bytes.
    pub size: u64,
    /// Bytes an unprivileged writer may still use.
    pub free: u64,
}

impl DiskSpace {
    /// Share of the size in use, 0 to 100 (100 for an empty size).
    pub fn used_pct(&self) -> f64 {
        if self.size == 0 {
            return 100.0;
        }
        100.0 * self.size.saturating_sub(self.free) as f64 / self.size as f64
    }
}

/// The [`DiskSpace`] of the filesystem holding `path`; `None` if it cannot be read.
pub fn disk_space(path: &Path) -> Option<DiskSpace> {
    let st = rustix::fs::statvfs(path).ok()?;
    let used = st.f_blocks.saturating_sub(st.f_bfree);
    Some(DiskSpace {
        size: used.saturating_add(st.f_bavail).saturating_mul(st.f_frsize),
        free: st.f_bavail.saturating_mul(st.f_frsize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn test_read_past_end_is_zeros() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&[7u8; 10], 0).unwrap();
        let mut buf = [9u8; 20];
        read_full_at(&f, &mut buf, 5).unwrap();
        assert_eq!(&buf[..5], &[7u8; 5]);
        assert_eq!(&buf[5..], &[0u8; 15]);
    }

    #[test]
    fn test_punch_hole_frees_blocks_and_keeps_size() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        f.write_all_at(&[1u8; 1 << 20], 0).unwrap();
        f.sync_all().unwrap();
        let before = f.metadata().unwrap();
        punch_hole(&f, 0, 1 << 20).unwrap();
        let after = f.metadata().unwrap();
        assert_eq!(after.len(), 1 << 20);
        assert!(after.blocks() < before.blocks());
        let mut buf = [1u8; 4096];
        read_full_at(&f, &mut buf, 8192).unwrap();
        assert_eq!(buf, [0u8; 4096]);
    }

    #[test]
    fn test_allocated_sees_holes_and_the_end_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        assert!(!allocated(&f, 0, 4096).unwrap(), "an empty file");
        f.write_all_at(&[1u8; 8192], 0).unwrap();
        f.write_all_at(&[1u8; 4096], 1 << 20).unwrap();
        assert!(allocated(&f, 0, 8192).unwrap());
        assert!(allocated(&f, 100, 10).unwrap());
        assert!(!allocated(&f, 4096, 8192).unwrap(), "runs into the hole");
        assert!(!allocated(&f, 64 << 10, 4096).unwrap(), "the hole");
        assert!(allocated(&f, 1 << 20, 4096).unwrap());
        assert!(!allocated(&f, 1 << 20, 8192).unwrap(), "past the end");
        assert!(!allocated(&f, 2 << 20, 1).unwrap(), "beyond the end");
        assert!(allocated(&f, 2 << 20, 0).unwrap(), "nothing to write");
    }

    #[test]
    fn test_disk_space_matches_df() {
        let dir = tempfile::tempdir().unwrap();
        let d = disk_space(dir.path()).unwrap();
        assert!(d.size > 0 && d.free <= d.size, "{d:?}");
        // df's own figures for the same filesystem (free space moves a little
        // meanwhile: other processes write).
        let o = std::process::Command::new("df")
            .args(["--output=used,avail", "-B1"])
            .arg(dir.path())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let nums: Vec<u64> = out
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        // Like ours, df's use percentage counts used plus available as the size.
        let (size, avail) = (nums[0] + nums[1], nums[1]);
        let near = |a: u64, b: u64| a.abs_diff(b) <= (1 << 30).max(b / 100);
        assert!(near(d.size, size), "statvfs {d:?}, df size {size}");
        assert!(near(d.free, avail), "statvfs {d:?}, df avail {avail}");
        assert!(disk_space(&dir.path().join("missing")).is_none());
    }
}
