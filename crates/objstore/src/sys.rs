//! The few system calls the object store needs beyond `std`: reads that treat the end
//! of a sparse file as zeros, hole punching, the data-directory lock and the file
//! descriptor limit that sizes the open-file cache.
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

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
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let done = buf.len();
        // SAFETY: pread writes at most `len - done` bytes into the spare capacity
        // starting at `done`, which the Vec owns; no reference to uninitialised
        // memory is made, and the length only grows over bytes pread wrote.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(done).cast(),
                len - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            // SAFETY: pread initialised `n` more bytes after `done`.
            n if n > 0 => unsafe { buf.set_len(done + n as usize) },
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
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
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
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
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    loop {
        // SAFETY: fallocate only reads its integer arguments; the descriptor is owned
        // by `file`, which outlives the call.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                n,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) => return write_zeros_at(file, offset, len),
            _ => return Err(err),
        }
    }
}

/// Take an exclusive, non-blocking `flock` on `file`: two stores on one data
/// directory would each have their own per-object locks and could tear blocks.
/// The lock goes away when `file` is closed.
pub(crate) fn lock_exclusive(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: flock only takes a descriptor owned by `file` and a flag word.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// The soft limit on open file descriptors, if it can be read.
pub(crate) fn nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, exclusively borrowed `lim`.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some(lim.rlim_cur)
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
    fn test_second_lock_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = || File::create(dir.path().join("LOCK")).unwrap();
        let a = open();
        lock_exclusive(&a).unwrap();
        let b = open();
        let err = lock_exclusive(&b).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EWOULDBLOCK));
        drop(a);
        lock_exclusive(&b).unwrap();
    }
}
