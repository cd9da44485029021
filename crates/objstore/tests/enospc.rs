//! A full disk surfaces as `ErrorKind::NoSpace`, on a real 1 MiB tmpfs.
//!
//! The tmpfs is mounted inside a private mount namespace of one thread of this test,
//! so nothing is visible to (or left behind on) the host even if the test dies.
//! Mounting needs root (CAP_SYS_ADMIN); without it the test prints "not run: ..."
//! and passes, except under CI (`CI=true`), where it fails.
use drove_objstore::{FileStore, ObjectStore};
use drove_types::{ErrorKind, ObjectId, VdiId};
use std::io;
use std::path::Path;

/// Enter a private mount namespace (this thread only) and mount a 1 MiB tmpfs on
/// `dir`.
fn mount_tiny_tmpfs(dir: &Path) -> io::Result<()> {
    use rustix::mount::{mount, mount_change, MountFlags, MountPropagationFlags};
    use rustix::thread::{unshare_unsafe, UnshareFlags};
    // SAFETY: NEWNS gives this thread its own copy of the mount table (and of its
    // fs_struct); no descriptor table is unshared, other threads are unaffected.
    unsafe { unshare_unsafe(UnshareFlags::NEWNS) }?;
    // Private: the mount below must not propagate back to the host's namespace.
    mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )?;
    let size = c"size=1M";
    mount("tmpfs", dir, "tmpfs", MountFlags::empty(), Some(size))?;
    Ok(())
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
        // The store sees its disk as full, as recovery's backfill-full check does.
        let d = s.disk_space().expect("a FileStore knows its disk");
        assert!(d.size > 0 && d.size <= 1 << 20, "{d:?}");
        assert!(d.used_pct() > 90.0, "{d:?}");
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
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "not run under CI: {reason}"
        );
        println!("not run: {reason}");
    }
}
