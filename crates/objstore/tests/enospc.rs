//! A full disk surfaces as `ErrorKind::NoSpace`, on a real 1 MiB tmpfs.
//!
//! The tmpfs is mounted inside a private mount namespace of one thread of this test,
//! so nothing is visible to (or left behind on) the host even if the test dies.
//! Mounting needs root (CAP_SYS_ADMIN); without it the test prints "not run: ..."
//! and passes, and the error mapping is then only covered by drove-types' unit test.
use drove_objstore::{FileStore, ObjectStore};
use drove_types::{ErrorKind, ObjectId, VdiId};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Enter a private mount namespace (this thread only) and mount a 1 MiB tmpfs on
/// `dir`.
fn mount_tiny_tmpfs(dir: &Path) -> io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // SAFETY: unshare takes a flag word; CLONE_NEWNS gives this thread its own copy
    // of the mount table (and of its fs_struct), other threads are unaffected.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    let root = CString::new("/").map_err(io::Error::other)?;
    // SAFETY: valid NUL-terminated path, null source/fstype/data are allowed for a
    // propagation change. Making the tree private keeps the mount below from
    // propagating back to the host's namespace.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })?;
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let fstype = CString::new("tmpfs").map_err(io::Error::other)?;
    let opts = CString::new("size=1M").map_err(io::Error::other)?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            opts.as_ptr().cast(),
        )
    })
}

#[test]
fn test_full_disk_is_no_space() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    // A thread of its own: the namespace dies with it, unmounting the tmpfs.
    let outcome = std::thread::spawn(move || -> Result<(), String> {
        if let Err(e) = mount_tiny_tmpfs(&path) {
            return Err(format!("cannot mount a tmpfs: {e}"));
        }
        let s = FileStore::open(&path, 4 << 20).unwrap();
        let chunk = vec![0x11u8; 256 * 1024];
        let mut written = 0u64;
        let mut err = None;
        'fill: for index in 0..4 {
            let o = ObjectId::new(VdiId(1), index);
            for off in (0..4u64 << 20).step_by(chunk.len()) {
                match s.write(o, off, &chunk) {
                    Ok(()) => written += chunk.len() as u64,
                    Err(e) => {
                        err = Some(e);
                        break 'fill;
                    }
                }
            }
        }
        let err = err.expect("16 MiB fit in a 1 MiB tmpfs");
        assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
        assert!(written <= 1 << 20, "wrote {written} bytes");
        // The store still works: what was written reads back, and freeing space
        // by zeroing makes room again.
        let first = ObjectId::new(VdiId(1), 0);
        assert_eq!(s.read(first, 0, 4096).unwrap(), vec![0x11; 4096]);
        s.write_zeroes(first, 0, 4 << 20).unwrap();
        s.write(first, 0, &chunk).unwrap();
        Ok(())
    })
    .join()
    .unwrap();
    if let Err(reason) = outcome {
        println!("not run: {reason}");
    }
}
