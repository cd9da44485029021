//! A full disk surfaces as `ErrorKind::NoSpace`, on a real small tmpfs; and the
//! store's reserve refuses writes that need new space before the disk is full.
//!
//! The tmpfs is mounted inside a private mount namespace of one thread of this test,
//! so nothing is visible to (or left behind on) the host even if the test dies.
//! Mounting needs root (CAP_SYS_ADMIN); without it the test prints "not run: ..."
//! and passes, except under CI (`CI=true`), where it fails.
use drove_objstore::{FileStore, ObjectStore};
use drove_types::{ErrorKind, ObjectId, VdiId};
use std::io;
use std::path::Path;

/// Enter a private mount namespace (this thread only) and mount a tmpfs of
/// `size` (`size=1M`) on `dir`.
fn mount_tiny_tmpfs(dir: &Path, size: &std::ffi::CStr) -> io::Result<()> {
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
    mount("tmpfs", dir, "tmpfs", MountFlags::empty(), Some(size))?;
    Ok(())
}

/// Run `body` on a store in a fresh tmpfs of `size` (a thread of its own: the
/// namespace dies with it, unmounting the tmpfs). Not run without root, except
/// under CI, where that fails.
fn on_tmpfs(size: &'static std::ffi::CStr, body: impl FnOnce(&Path) + Send + 'static) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let outcome = std::thread::spawn(move || -> Result<(), String> {
        if let Err(e) = mount_tiny_tmpfs(&path, size) {
            return Err(format!("cannot mount a tmpfs: {e}"));
        }
        body(&path);
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

#[test]
fn test_full_disk_is_no_space() {
    on_tmpfs(c"size=1M", |path| {
        // No reserve: the file system itself says ENOSPC.
        let s = FileStore::open_reserving(path, 4 << 20, Some(0)).unwrap();
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
    });
}

#[test]
fn test_the_reserve_refuses_new_space_and_keeps_room_for_the_node() {
    on_tmpfs(c"size=4M", |path| {
        let reserve = 1 << 20;
        let s = FileStore::open_reserving(path, 4 << 20, Some(reserve)).unwrap();
        assert_eq!(s.reserve(), reserve);
        let block = vec![0x22u8; 64 * 1024];
        let mut err = None;
        let mut last = None;
        'fill: for index in 0..4 {
            let o = ObjectId::new(VdiId(1), index);
            for off in (0..4u64 << 20).step_by(block.len()) {
                match s.write(o, off, &block) {
                    Ok(()) => last = Some((o, off)),
                    Err(e) => {
                        err = Some((o, e));
                        break 'fill;
                    }
                }
            }
        }
        let (refused, err) = err.expect("16 MiB fit in a 4 MiB tmpfs");
        assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
        assert!(err.to_string().contains("keeps"), "{err}");
        // Refused before the file system was full: the reserve is still free,
        // give or take the last write admitted.
        let free = s.disk_space().unwrap().free;
        assert!(free + block.len() as u64 * 2 >= reserve, "{free} free");
        // Overwriting blocks that are allocated needs no space: it goes on.
        let (o, off) = last.unwrap();
        s.write(o, off, &vec![0x33u8; block.len()]).unwrap();
        assert_eq!(s.read(o, off, 4096).unwrap(), vec![0x33; 4096]);
        // A new object is refused without being created (a clone would read
        // zeros from an empty one instead of its parent's data).
        let fresh = ObjectId::new(VdiId(2), 0);
        let e = s.write(fresh, 0, &block).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(!s.exists(fresh).unwrap());
        let e = s.create(fresh, &block, Default::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(!s.exists(fresh).unwrap());
        // A recovery copy over an object is refused before the old copy goes.
        let e = s.replace(o, &block, Default::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!(s.read(o, off, 4096).unwrap(), vec![0x33; 4096]);
        // Freeing space (a VDI deleted) lets new writes in again.
        for index in 0..4 {
            s.delete(ObjectId::new(VdiId(1), index)).unwrap();
        }
        s.write(refused, 0, &block).unwrap();
        s.write(fresh, 0, &block).unwrap();
    });
}
