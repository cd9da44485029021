//! Trust roots that follow their file. The CA certificate file (`ca-cert.pem`) may
//! hold several CA certificates, and a node reads it again when it changes (looked
//! at on a handshake, at most every [`CHECK_EVERY`]): moving a cluster to a new CA
//! is adding the new CA to every node's file, issuing new certificates of it, then
//! removing the old CA, each step taken by the next handshakes, without a restart.
//! Connections already open keep what they verified. A file that cannot be read or
//! holds no usable certificate is refused with a warning, and the roots in use stay.
use crate::config::load_roots;
use crate::reload::CHECK_EVERY;
use crate::{Error, Result};
use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// What tells that the file changed: its modification time and length.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(p: &Path) -> Stamp {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// When to read the CA file again.
struct Watch {
    path: PathBuf,
    stamp: Stamp,
    checked: Instant,
}

impl Watch {
    /// Taken before the first read, so that a change during it is seen later.
    fn new(path: &Path) -> Watch {
        Watch {
            path: path.to_path_buf(),
            stamp: stamp(path),
            checked: Instant::now(),
        }
    }

    /// The roots in the file, when it changed since the last look and can be used.
    fn changed(&mut self) -> Option<Arc<RootCertStore>> {
        if self.checked.elapsed() < CHECK_EVERY {
            return None;
        }
        self.checked = Instant::now();
        let now = stamp(&self.path);
        if now == self.stamp {
            return None;
        }
        self.stamp = now;
        match load_roots(&self.path) {
            Ok(roots) if !roots.is_empty() => Some(roots),
            Ok(_) => {
                tracing::warn!(ca = %self.path.display(), "the CA file changed but holds no certificate; the CA certificates in use stay");
                None
            }
            Err(e) => {
                tracing::warn!(ca = %self.path.display(), "the CA file changed but cannot be used ({e}); the CA certificates in use stay");
                None
            }
        }
    }
}

/// Rebuild `verifier` with `build` when the CA file of `watch` changed and can be
/// used; whether it was.
fn refresh<V: ?Sized>(
    watch: &mut Watch,
    verifier: &mut Arc<V>,
    build: &dyn Fn(Arc<RootCertStore>) -> Result<Arc<V>>,
) -> bool {
    let Some(roots) = watch.changed() else {
        return false;
    };
    match build(roots) {
        Ok(v) => {
            *verifier = v;
            tracing::info!(ca = %watch.path.display(), "CA certificates reloaded");
            true
        }
        Err(e) => {
            tracing::warn!(
                ca = %watch.path.display(),
                "the CA file changed but cannot be used ({e}); the CA certificates in use stay"
            );
            false
        }
    }
}

/// The names of the trusted CAs a server sends with its certificate request,
/// kept for the life of the process: rustls lends them out by reference. One list
/// per reload of the CA file, which happens when an operator changes the file.
fn keep(hints: &[DistinguishedName]) -> &'static [DistinguishedName] {
    Box::leak(hints.to_vec().into_boxed_slice())
}

type BuildClient =
    Box<dyn Fn(Arc<RootCertStore>) -> Result<Arc<dyn ClientCertVerifier>> + Send + Sync>;

struct ClientState {
    watch: Watch,
    verifier: Arc<dyn ClientCertVerifier>,
    hints: &'static [DistinguishedName],
}

/// A client certificate verifier rebuilt from the CA file when it changes.
pub(crate) struct ReloadingClientVerifier {
    build: BuildClient,
    state: Mutex<ClientState>,
}

impl std::fmt::Debug for ReloadingClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("ReloadingClientVerifier")
            .field("ca", &s.watch.path)
            .finish()
    }
}

impl ReloadingClientVerifier {
    /// Read the CA file `ca` now and build with `build`; again whenever it changes.
    pub(crate) fn load(
        ca: &Path,
        build: impl Fn(Arc<RootCertStore>) -> Result<Arc<dyn ClientCertVerifier>>
            + Send
            + Sync
            + 'static,
    ) -> Result<Arc<Self>> {
        let watch = Watch::new(ca);
        let verifier = build(load_roots(ca)?)?;
        let hints = keep(verifier.root_hint_subjects());
        Ok(Arc::new(ReloadingClientVerifier {
            build: Box::new(build),
            state: Mutex::new(ClientState {
                watch,
                verifier,
                hints,
            }),
        }))
    }

    fn current(&self) -> (Arc<dyn ClientCertVerifier>, &'static [DistinguishedName]) {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        if refresh(&mut s.watch, &mut s.verifier, &*self.build) {
            s.hints = keep(s.verifier.root_hint_subjects());
        }
        (s.verifier.clone(), s.hints)
    }
}

impl ClientCertVerifier for ReloadingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.current().0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.current().0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.current().1
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.current()
            .0
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current().0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current().0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().0.supported_verify_schemes()
    }
}

type BuildServer =
    Box<dyn Fn(Arc<RootCertStore>) -> Result<Arc<dyn ServerCertVerifier>> + Send + Sync>;

/// A server certificate verifier rebuilt from the CA file when it changes.
pub(crate) struct ReloadingServerVerifier {
    build: BuildServer,
    state: Mutex<(Watch, Arc<dyn ServerCertVerifier>)>,
}

impl std::fmt::Debug for ReloadingServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("ReloadingServerVerifier")
            .field("ca", &s.0.path)
            .finish()
    }
}

impl ReloadingServerVerifier {
    /// Read the CA file `ca` now and build with `build`; again whenever it changes.
    pub(crate) fn load(
        ca: &Path,
        build: impl Fn(Arc<RootCertStore>) -> Result<Arc<dyn ServerCertVerifier>>
            + Send
            + Sync
            + 'static,
    ) -> Result<Arc<Self>> {
        let watch = Watch::new(ca);
        let verifier = build(load_roots(ca)?)?;
        Ok(Arc::new(ReloadingServerVerifier {
            build: Box::new(build),
            state: Mutex::new((watch, verifier)),
        }))
    }

    fn current(&self) -> Arc<dyn ServerCertVerifier> {
        let mut guard = self.state.lock();
        let (watch, verifier) = &mut *guard;
        refresh(watch, verifier, &*self.build);
        verifier.clone()
    }
}

impl ServerCertVerifier for ReloadingServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.current()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

/// The error of a verifier that cannot be built from the roots of `path`.
pub(crate) fn verifier_error(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Verifier {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}
