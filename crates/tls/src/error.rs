//! What can go wrong with certificates: every variant names the file, so that a node
//! refusing to start says which one to fix.
use std::path::PathBuf;

/// A certificate or key could not be made, read, written or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a file failed (missing, unreadable).
    #[error("Cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Writing a file or making its directory failed.
    #[error("Cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Refused to replace an existing certificate or key.
    #[error("{} already exists: remove it, or write to another directory", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// A file is not what it should be: not PEM, the wrong kind of PEM, too big.
    #[error("{}: {why}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, in words.
        why: String,
    },
    /// A private key file may be read by other users.
    #[error(
        "{} may be read by other users (mode {mode:o}): `chmod 600` it",
        path.display()
    )]
    KeyMode {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A name or host given for a certificate cannot go into one.
    #[error("Bad certificate name '{name}': {why}")]
    BadName {
        /// The name as given.
        name: String,
        /// Why it was refused.
        why: &'static str,
    },
    /// rcgen could not generate a key or sign a certificate.
    #[error("Cannot generate {what}")]
    Generate {
        /// What was being made.
        what: &'static str,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
    /// rustls refused the certificates or keys as a configuration.
    #[error("The certificates in {} do not make a TLS configuration", dir.display())]
    Config {
        /// The directory (or file) they came from.
        dir: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The CA certificate cannot be used to verify peers.
    #[error("The CA certificate {} cannot verify peers: {why}", path.display())]
    Verifier {
        /// The CA certificate file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}
