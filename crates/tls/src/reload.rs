//! Certificates replaced while a node runs. A node's (or a client's) certificate
//! and key are read again when their files change, for the next handshakes;
//! connections already open keep what they negotiated, so nothing is interrupted.
//! Rotation is: issue a new certificate of the same CA (`drove cert node`), put the
//! two files in place, and wait a second. A new pair that cannot be read, or whose
//! key does not match its certificate (the files are replaced one after the other),
//! is refused with a warning, and the pair in use stays until a good one is there.
//!
//! The CA certificate file (trust roots) follows its file too ([`crate::roots`]).
use crate::files::{load_certs, load_key};
use crate::{Error, Identity, Result};
use parking_lot::Mutex;
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The files are looked at no more often than this (on a handshake).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What tells that a file changed: its modification time and length.
type Stamp = [Option<(SystemTime, u64)>; 2];

fn stamp(id: &Identity) -> Stamp {
    [&id.cert, &id.key].map(|p| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    })
}

/// The certificate and key of `id`, checked to belong together.
fn load_pair(id: &Identity, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>> {
    let certs = load_certs(&id.cert)?;
    let key = load_key(&id.key)?;
    CertifiedKey::from_der(certs, key, provider)
        .map(Arc::new)
        .map_err(|source| Error::Config {
            dir: id.cert.clone(),
            source,
        })
}

#[derive(Debug)]
struct State {
    key: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

/// A certificate and key that follow their files (see the module doc); the
/// certificate resolver of drove's server and client configurations.
#[derive(Debug)]
pub struct ReloadingIdentity {
    id: Identity,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

impl ReloadingIdentity {
    /// Read `id`'s files now (an error if they cannot be used).
    pub fn load(id: &Identity, provider: Arc<CryptoProvider>) -> Result<Arc<Self>> {
        let stamp = stamp(id);
        let key = load_pair(id, &provider)?;
        Ok(Arc::new(ReloadingIdentity {
            id: id.clone(),
            provider,
            state: Mutex::new(State {
                key,
                stamp,
                checked: Instant::now(),
            }),
        }))
    }

    /// The pair to present: read again first when the files changed since the
    /// last look (at most every [`CHECK_EVERY`]).
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock();
        if s.checked.elapsed() >= CHECK_EVERY {
            s.checked = Instant::now();
            let now = stamp(&self.id);
            if now != s.stamp {
                s.stamp = now;
                match load_pair(&self.id, &self.provider) {
                    Ok(k) => {
                        s.key = k;
                        tracing::info!(cert = %self.id.cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => tracing::warn!(
                        cert = %self.id.cert.display(),
                        "TLS certificate files changed but cannot be used ({e}); the previous certificate stays in use"
                    ),
                }
            }
        }
        s.key.clone()
    }
}

impl ResolvesServerCert for ReloadingIdentity {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for ReloadingIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
