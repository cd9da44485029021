//! The room a node keeps free on its disk for itself.
//!
//! The node's metadata (its Raft log and state in `meta/raft.redb`), its recovery
//! record and its logs live on the same file system as the objects. When client
//! writes fill that file system to the last byte, the next Raft append fails with
//! ENOSPC, and openraft stops for good on a storage error: the node's metadata is
//! dead until the process restarts. So the store keeps a reserve: once less than
//! [`Reserve::bytes`] is free, a write that needs new blocks (a hole filled, an
//! object created, a recovery copy) fails with `NoSpace` while the disk still has
//! room for the metadata; an overwrite of blocks already allocated goes on, and
//! reads and deletes always do. The client sees ENOSPC (QEMU's `werror=enospc`
//! pauses the VM), the operator frees space or adds nodes, and nothing else breaks.
use crate::sys;
use drove_types::{format_size, Error, ErrorKind, Result};
use std::io;
use std::path::PathBuf;

/// Smallest default reserve: what a metadata log of a few thousand entries and a
/// snapshot take, with room to spare.
const MIN_DEFAULT: u64 = 8 << 20;
/// Largest default reserve.
const MAX_DEFAULT: u64 = 1 << 30;

/// The default reserve on a file system of `size` bytes: 2 % of it, at least 8 MiB
/// and at most 1 GiB.
pub fn default_reserve(size: u64) -> u64 {
    (size / 50).clamp(MIN_DEFAULT, MAX_DEFAULT)
}

/// The free space a store leaves to the rest of its node.
pub(crate) struct Reserve {
    /// A directory on the file system to watch.
    root: PathBuf,
    /// Bytes kept free.
    pub(crate) bytes: u64,
}

impl Reserve {
    /// Keep `bytes` free on the file system of `root`; `None`: the default for its
    /// size ([`default_reserve`]).
    pub(crate) fn new(root: PathBuf, bytes: Option<u64>) -> Reserve {
        let bytes = bytes.unwrap_or_else(|| {
            sys::disk_space(&root).map_or(MIN_DEFAULT, |d| default_reserve(d.size))
        });
        Reserve { root, bytes }
    }

    /// Whether the free space is below the reserve (one `statvfs`, about a
    /// microsecond; a file system whose space cannot be read is never low).
    pub(crate) fn low(&self) -> Option<sys::DiskSpace> {
        sys::disk_space(&self.root).filter(|d| d.free < self.bytes)
    }

    /// `Ok` unless the free space is below the reserve and `needs_space` says the
    /// write of `what` needs new blocks.
    pub(crate) fn admit(
        &self,
        what: impl FnOnce() -> String,
        needs_space: impl FnOnce() -> io::Result<bool>,
    ) -> Result<()> {
        let Some(d) = self.low() else {
            return Ok(());
        };
        // A hole or an unreadable layout counts as needing space: refusing is safe.
        if !needs_space().unwrap_or(true) {
            return Ok(());
        }
        Err(self.full(what(), d))
    }

    /// The error of a write refused for lack of space.
    pub(crate) fn full(&self, what: String, d: sys::DiskSpace) -> Error {
        Error::new(
            ErrorKind::NoSpace,
            format!(
                "{what}: no space left on device (the disk of {} has {} free; the node keeps {} \
                 for its metadata, so writes that need new space are refused until space is freed)",
                self.root.display(),
                format_size(d.free),
                format_size(self.bytes)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_default_reserve_is_two_percent_within_its_bounds() {
        assert_eq!(default_reserve(48 << 20), 8 << 20);
        assert_eq!(default_reserve(100 << 30), 1 << 30);
        assert_eq!(default_reserve(10 << 30), (10 << 30) / 50);
        assert_eq!(default_reserve(10 << 40), 1 << 30);
    }

    #[test]
    fn test_a_write_is_refused_only_below_the_reserve_and_when_it_needs_space() {
        let dir = tempfile::tempdir().unwrap();
        let free = sys::disk_space(dir.path()).unwrap().free;
        let roomy = Reserve::new(dir.path().to_path_buf(), Some(0));
        assert!(roomy.admit(|| "w".into(), || Ok(true)).is_ok());
        let tight = Reserve::new(dir.path().to_path_buf(), Some(free + (1 << 30)));
        assert!(tight.admit(|| "w".into(), || Ok(false)).is_ok());
        let e = tight.admit(|| "w".into(), || Ok(true)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(e.to_string().contains("no space left on device"), "{e}");
        let e = tight
            .admit(|| "w".into(), || Err(io::Error::other("x")))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
    }
}
