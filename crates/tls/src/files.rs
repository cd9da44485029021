//! Certificates and keys on disk: PEM files, written with mode 0600 from the moment
//! they exist (the mode is given to `open`, so there is no window in which a key is
//! readable by others), and read back with a size bound and a permission check.
use crate::{Error, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Largest PEM file read. A certificate chain is a few KiB; anything much larger is
/// not one, and is not read into memory.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// Create `dir` (and its parents) with mode 0700 if it does not exist.
pub fn create_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })
}

/// Write `text` to a new file `path` with mode 0600. An existing file is an error
/// unless `replace`: a CA key overwritten by mistake orphans every certificate it signed.
pub fn write_private(path: &Path, text: &str, replace: bool) -> Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(0o600);
    if replace {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let err = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut f = opts.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::Exists {
                path: path.to_path_buf(),
            }
        } else {
            err(e)
        }
    })?;
    // A replaced file keeps its old mode through `open`: set it again.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)
}

/// Refuse to overwrite any of `paths` (checked before anything is written, so that
/// a refused command leaves no half-written set behind).
pub fn check_absent(paths: &[PathBuf]) -> Result<()> {
    match paths.iter().find(|p| p.exists()) {
        Some(p) => Err(Error::Exists { path: p.clone() }),
        None => Ok(()),
    }
}

/// Read a PEM file of at most [`MAX_PEM_BYTES`].
pub fn read_pem(path: &Path) -> Result<Vec<u8>> {
    let err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(err)?;
    let mut buf = Vec::new();
    f.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(err)?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(invalid(path, "larger than 1 MiB: not a certificate or key"));
    }
    Ok(buf)
}

fn invalid(path: &Path, why: impl Into<String>) -> Error {
    Error::Invalid {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// The certificates in a PEM file, in order (leaf first for a chain); at least one.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "holds no CERTIFICATE"));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1). The file must not be
/// readable by other users.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    check_key_mode(path)?;
    let pem = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| invalid(path, format!("holds no private key: {e}")))
}

/// The key as PEM text, for rcgen (which signs with it).
pub fn load_key_pem(path: &Path) -> Result<String> {
    check_key_mode(path)?;
    let pem = read_pem(path)?;
    String::from_utf8(pem).map_err(|_| invalid(path, "not a PEM text file"))
}

fn check_key_mode(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o007 != 0 {
        return Err(Error::KeyMode {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_private_files_are_0600_and_not_overwritten() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k.pem");
        write_private(&p, "secret", false).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(
            write_private(&p, "other", false),
            Err(Error::Exists { .. })
        ));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "secret");
        // Replacing restores 0600 even on a file someone opened up.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&p, "new", true).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn test_bad_files_are_errors_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("missing.pem");
        let e = load_certs(&missing).unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
        let junk = d.path().join("junk.pem");
        std::fs::write(&junk, "not pem at all").unwrap();
        assert!(matches!(load_certs(&junk), Err(Error::Invalid { .. })));
        let big = d.path().join("big.pem");
        std::fs::write(&big, vec![b'a'; (MAX_PEM_BYTES + 1) as usize]).unwrap();
        assert!(matches!(load_certs(&big), Err(Error::Invalid { .. })));
        let open = d.path().join("open-key.pem");
        std::fs::write(&open, "x").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(load_key(&open), Err(Error::KeyMode { .. })));
    }
}
