//! The error every library crate returns at its boundary: a stable [`ErrorKind`] that
//! callers match on, a short message, and an optional source.
use serde::{Deserialize, Serialize};
use std::fmt;

/// What went wrong, in terms a caller can act on. Travels over the wire.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The VDI, object, node or export does not exist.
    NotFound,
    /// A VDI or node with that name already exists.
    AlreadyExists,
    /// The sender works from a cluster map older than the receiver's: it must wait
    /// for the newer map and send the request again (to the replicas of that map).
    StaleEpoch,
    /// A replica, node or the metadata leader could not be reached in time.
    Unavailable,
    /// Stored data failed its checksum.
    Corrupt,
    /// The local disk returned an error.
    Io,
    /// The request itself is wrong (bad size, offset past the end, bad name).
    Invalid,
    /// A disk is full.
    NoSpace,
    /// The VDI is being written through another node (it holds the VDI's lock).
    Locked,
    // Variants are encoded by position on the wire: new ones go at the end.
    /// A write carries a lock generation older than the newest the receiver knows
    /// for its VDI: another gateway holds the VDI's lock now (fencing). Final.
    Fenced,
    /// The receiver's copy of the object is being recovered (it may lack
    /// acknowledged writes): read another replica.
    Recovering,
    /// The VDI was deleted (or rolled back, or never existed on this cluster).
    Gone,
    /// A metadata command was proposed but no answer came in time: it may or may not
    /// be applied. Sent again with the same client request id, it is applied at most
    /// once and answers with its outcome.
    OutcomeUnknown,
}

impl ErrorKind {
    /// A short lower-case name, used in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::StaleEpoch => "stale_epoch",
            ErrorKind::Fenced => "fenced",
            ErrorKind::Recovering => "recovering",
            ErrorKind::Gone => "gone",
            ErrorKind::OutcomeUnknown => "outcome_unknown",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Io => "io",
            ErrorKind::Invalid => "invalid",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Locked => "locked",
        }
    }
}

/// An error with a kind, a message and maybe a cause.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with message `msg`.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Error {
            kind,
            msg: msg.into(),
            source: None,
        }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// An I/O error from the local disk; ENOSPC and EDQUOT become [`ErrorKind::NoSpace`].
    pub fn io(msg: impl Into<String>, err: std::io::Error) -> Self {
        let kind = match err.raw_os_error() {
            Some(28) | Some(122) => ErrorKind::NoSpace,
            _ if err.kind() == std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::Io,
        };
        Error::new(kind, msg).with_source(err)
    }

    /// Shorthand for [`ErrorKind::NotFound`].
    pub fn not_found(msg: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotFound, msg)
    }

    /// Shorthand for [`ErrorKind::Invalid`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::new(ErrorKind::Invalid, msg)
    }

    /// Shorthand for [`ErrorKind::Unavailable`].
    pub fn unavailable(msg: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unavailable, msg)
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message without its source.
    pub fn message(&self) -> &str {
        &self.msg
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_enospc_maps_to_no_space() {
        let e = Error::io("write", std::io::Error::from_raw_os_error(28));
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(e.to_string().starts_with("write: "));
    }
}
