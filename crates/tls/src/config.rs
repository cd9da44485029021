//! rustls configurations from certificate files, for any drove listener or dialer:
//! NBD's STARTTLS now, peer and Raft mutual TLS later. One crypto provider (ring)
//! and rustls's safe defaults (TLS 1.2 and 1.3, no weak suites).
use crate::files::load_certs;
use crate::reload::ReloadingIdentity;
use crate::roots::{verifier_error, ReloadingClientVerifier};
use crate::{Error, Result, CA_CERT, CLIENT_CERT, CLIENT_KEY, SERVER_CERT, SERVER_KEY};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::CertificateDer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether a server asks its clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate asked for.
    None,
    /// A certificate signed by the CA is checked if sent; clients without one pass.
    Optional,
    /// A certificate signed by the CA is required.
    Required,
}

/// A certificate and its key, as file paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Certificate (chain), PEM.
    pub cert: PathBuf,
    /// Private key, PEM.
    pub key: PathBuf,
}

impl Identity {
    /// A node's identity in its TLS directory: `server-cert.pem`, `server-key.pem`.
    pub fn node(dir: &Path) -> Identity {
        Identity {
            cert: dir.join(SERVER_CERT),
            key: dir.join(SERVER_KEY),
        }
    }

    /// A client's identity in its directory: `client-cert.pem`, `client-key.pem`.
    pub fn client(dir: &Path) -> Identity {
        Identity {
            cert: dir.join(CLIENT_CERT),
            key: dir.join(CLIENT_KEY),
        }
    }
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The CA certificates of `path` as trust roots.
pub fn load_roots(path: &Path) -> Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c).map_err(|e| Error::Verifier {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

fn config_err(dir: &Path) -> impl FnOnce(rustls::Error) -> Error + '_ {
    move |source| Error::Config {
        dir: dir.to_path_buf(),
        source,
    }
}

/// A server presenting `id` (read again when its files change: see
/// [`crate::reload`]), checking client certificates against the CA in `ca` as `auth`
/// says.
pub fn server_config(ca: &Path, id: &Identity, auth: ClientAuth) -> Result<Arc<ServerConfig>> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(config_err(ca))?;
    let builder = match auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Optional | ClientAuth::Required => {
            // The CA file is read again when it changes (crate::roots).
            let (p, path) = (provider.clone(), ca.to_path_buf());
            let verifier = ReloadingClientVerifier::load(ca, move |roots| {
                let mut v = WebPkiClientVerifier::builder_with_provider(roots, p.clone());
                if auth == ClientAuth::Optional {
                    v = v.allow_unauthenticated();
                }
                v.build().map_err(|e| verifier_error(&path, e))
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(ReloadingIdentity::load(id, provider)?);
    no_resumption(&mut config);
    Ok(Arc::new(config))
}

/// No session resumption: a resumed TLS session is not checked against the CA file
/// again, so a client whose CA was removed (or whose certificate expired) would
/// still get in with a session ticket from before. Every connection is a full
/// handshake instead (connections are long-lived: NBD, peers; a CLI command makes
/// one).
pub(crate) fn no_resumption(config: &mut ServerConfig) {
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
}

/// The server configuration of a node from its TLS directory (`ca-cert.pem`,
/// `server-cert.pem`, `server-key.pem`).
pub fn node_server_config(dir: &Path, auth: ClientAuth) -> Result<Arc<ServerConfig>> {
    server_config(&dir.join(CA_CERT), &Identity::node(dir), auth)
}

/// A client trusting only the CA in `ca`, presenting `id` when the server asks
/// (read again when its files change).
pub fn client_config(ca: &Path, id: Option<&Identity>) -> Result<Arc<ClientConfig>> {
    let roots = load_roots(ca)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_err(ca))?
        .with_root_certificates(roots);
    let config = match id {
        None => builder.with_no_client_auth(),
        Some(id) => builder.with_client_cert_resolver(ReloadingIdentity::load(id, provider())?),
    };
    Ok(Arc::new(config))
}

/// The common name (CN) of a verified peer certificate: a client's name for access
/// lists and logs. `None` when the certificate has none or does not parse.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).ok()?;
    let cn = x509.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
