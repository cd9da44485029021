//! The one place that turns a backend [`ErrorKind`] into the errno an NBD client sees in
//! a reply. The NBD protocol allows only a few values (EPERM, EIO, ENOMEM, EINVAL, ENOSPC,
//! EOVERFLOW, ENOTSUP, ESHUTDOWN), so several kinds collapse onto EIO.
use crate::proto::{NBD_EINVAL, NBD_EIO, NBD_ENOSPC, NBD_EPERM};
use drove_types::ErrorKind;

/// The NBD error value for an error of `kind`.
///
/// - `NotFound`, `Invalid` → `NBD_EINVAL`: the request names something that is not there
///   (an offset past the end, a vanished object); retrying it unchanged cannot succeed.
/// - `NoSpace` → `NBD_ENOSPC`: a replica's disk is full; guests report it as such.
/// - `Locked`, `Fenced` → `NBD_EPERM`: another node holds the VDI's write lock (or took
///   it from this gateway); this client may read but not write until the lock is
///   handed over.
/// - `StaleEpoch` → `NBD_EIO`: the gateway gave up waiting for a newer cluster map
///   that a replica already has. The I/O did not happen; the guest must see a failed
///   I/O, not a "bad argument".
/// - `Recovering` → `NBD_EIO`: every replica's copy was under recovery at once.
/// - `Gone` → `NBD_EIO`: the VDI was deleted under the client; never zeros.
/// - `Io`, `Corrupt`, `Unavailable`, `AlreadyExists` and anything added later →
///   `NBD_EIO`: the data could not be read or stored; only EIO says that to a guest.
pub fn errno_for(kind: ErrorKind) -> u32 {
    match kind {
        ErrorKind::NotFound | ErrorKind::Invalid => NBD_EINVAL,
        ErrorKind::NoSpace => NBD_ENOSPC,
        ErrorKind::Locked | ErrorKind::Fenced => NBD_EPERM,
        ErrorKind::StaleEpoch
        | ErrorKind::Recovering
        | ErrorKind::Gone
        | ErrorKind::Io
        | ErrorKind::Corrupt
        | ErrorKind::Unavailable
        | ErrorKind::AlreadyExists => NBD_EIO,
        _ => NBD_EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_errno_for_every_kind() {
        assert_eq!(errno_for(ErrorKind::NotFound), 22);
        assert_eq!(errno_for(ErrorKind::Invalid), 22);
        assert_eq!(errno_for(ErrorKind::NoSpace), 28);
        assert_eq!(errno_for(ErrorKind::Locked), 1);
        assert_eq!(errno_for(ErrorKind::Fenced), 1);
        assert_eq!(errno_for(ErrorKind::Recovering), 5);
        assert_eq!(errno_for(ErrorKind::Gone), 5);
        assert_eq!(errno_for(ErrorKind::StaleEpoch), 5);
        assert_eq!(errno_for(ErrorKind::Io), 5);
        assert_eq!(errno_for(ErrorKind::Corrupt), 5);
        assert_eq!(errno_for(ErrorKind::Unavailable), 5);
        assert_eq!(errno_for(ErrorKind::AlreadyExists), 5);
    }
}
