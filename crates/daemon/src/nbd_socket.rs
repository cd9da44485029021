//! The NBD unix socket, `DATA/nbd.sock`: whoever can connect to it can read and
//! write every VDI, with no other check. It is mode 0660, its group the one
//! `--nbd-socket-group` names (the node's own group by default), whatever the
//! umask: under umask 000 it was once 0777, open to every local user.
//!
//! `bind` makes the file with the umask's mode, and its mode is set just after. A
//! connection made in between would wait in the backlog and be accepted later, so
//! the window must be closed to others: [`bind`] runs while the data directory is
//! 0700 ([`crate::datadir::DataDir::acquire`] closed it), and `connect` needs search
//! permission on every directory of the path at the moment it is called. Only the
//! node's user (and root) can connect before the mode is set; the directory is
//! opened to the group after ([`crate::datadir::DataDir::open_to`]).
use drove_types::{Error, Result};
use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use tokio::net::UnixListener;

/// The socket's mode: its user and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// The group id `name` stands for (a group name, or a number), or this
/// process's effective group without one.
pub fn group_id(name: Option<&str>) -> Result<u32> {
    let Some(name) = name else {
        return Ok(rustix::process::getegid().as_raw());
    };
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    lookup_group(name)?.ok_or_else(|| {
        Error::invalid(format!(
            "Unknown group '{name}' for --nbd-socket-group (see getent group)"
        ))
    })
}

/// The id of group `name` from the system's group database (files, LDAP, ...).
fn lookup_group(name: &str) -> Result<Option<u32>> {
    let bad = || Error::invalid(format!("Bad group name '{name}' for --nbd-socket-group"));
    let cname = std::ffi::CString::new(name).map_err(|_| bad())?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `libc::group` is a plain C struct of integers and pointers, for
        // which all zeroes is a valid value.
        let mut group: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `cname` is a NUL-terminated
        // string, `group` and `found` are live locals, and `buf` is writable for
        // `buf.len()` bytes. The strings `group` points to live in `buf`; only the
        // integer `gr_gid` is read after.
        let rc = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut group,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 {
            return Err(Error::io(
                format!("Cannot look up group '{name}'"),
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        return Ok((!found.is_null()).then_some(group.gr_gid));
    }
}

/// Listen on the unix socket at `path` (a file left by a killed node is replaced),
/// mode [`SOCKET_MODE`] and group `gid`. Call while its directory is closed to
/// others (see the module doc).
pub fn bind(path: &Path, gid: u32) -> Result<UnixListener> {
    // A socket file left by a killed node would make bind fail.
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .map_err(|e| Error::io(format!("Cannot listen on {}", path.display()), e))?;
    std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| {
        Error::io(
            format!(
                "Cannot give {} to group {gid} (the node's user must be a member of the \
                 --nbd-socket-group)",
                path.display()
            ),
            e,
        )
    })?;
    std::fs::set_permissions(path, Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| Error::io(format!("Cannot set the mode of {}", path.display()), e))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn test_groups_are_found_by_name_or_number_and_unknown_ones_refused() {
        let mine = rustix::process::getegid().as_raw();
        assert_eq!(group_id(None).unwrap(), mine);
        assert_eq!(group_id(Some("4242")).unwrap(), 4242);
        // Group 0 is root on every Linux system.
        assert_eq!(group_id(Some("root")).unwrap(), 0);
        let e = group_id(Some("no-such-group-for-drove")).unwrap_err();
        assert!(e.to_string().contains("Unknown group"), "{e}");
        assert!(group_id(Some("a\0b")).is_err());
    }

    #[tokio::test]
    async fn test_the_socket_is_0660_with_its_group_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        std::fs::write(&path, b"left by a killed node").unwrap();
        let gid = group_id(None).unwrap();
        let l = bind(&path, gid).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.mode() & 0o7777, SOCKET_MODE, "mode {:o}", m.mode());
        assert_eq!(m.gid(), gid);
        let _c = tokio::net::UnixStream::connect(&path).await.unwrap();
        l.accept().await.unwrap();
    }
}
