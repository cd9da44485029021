//! Mutual TLS between the nodes of one cluster (the peer port: object traffic, Raft,
//! forwarded metadata writes, heartbeats).
//!
//! A node proves it is one by a certificate signed by the cluster CA that carries
//! the name [`NODE_NAME`] (every certificate `drove cert node` and `drove up` issue
//! does; a client certificate, say a hypervisor's for NBD, does not). Both ends
//! check that, whatever address was dialled: peers are reached at addresses from
//! the cluster map, which a certificate need not list, and behind WAN-emulating
//! proxies at addresses no certificate could list.
use crate::reload::ReloadingIdentity;
use crate::roots::{ReloadingClientVerifier, ReloadingServerVerifier};
use crate::{Error, Result, CA_CERT, NODE_NAME};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::path::Path;
use std::sync::Arc;

/// The ALPN protocol of drove's peer frames.
pub const ALPN_PEER: &[u8] = b"drove-peer/2";
/// The ALPN protocol of the metadata's internal HTTP routes.
pub const ALPN_HTTP: &[u8] = b"http/1.1";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn node_name() -> ServerName<'static> {
    ServerName::try_from(NODE_NAME).expect("NODE_NAME is a DNS name")
}

/// Whether a certificate names [`NODE_NAME`] among its subject alternative names.
pub fn is_node_cert(cert: &CertificateDer<'_>) -> bool {
    let Ok((_, x509)) = x509_parser::parse_x509_certificate(cert) else {
        return false;
    };
    let Ok(Some(san)) = x509.subject_alternative_name() else {
        return false;
    };
    san.value
        .general_names
        .iter()
        .any(|n| matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if *d == NODE_NAME))
}

/// Checks a server's certificate as the node certificate of the cluster, whatever
/// name was dialled.
#[derive(Debug)]
struct ServerIsNode(Arc<dyn ServerCertVerifier>);

impl ServerCertVerifier for ServerIsNode {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.0
            .verify_server_cert(end_entity, intermediates, &node_name(), ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Requires a client certificate signed by the CA that is a node certificate.
#[derive(Debug)]
struct ClientIsNode(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for ClientIsNode {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        let ok = self.0.verify_client_cert(end_entity, intermediates, now)?;
        if !is_node_cert(end_entity) {
            return Err(rustls::Error::General(format!(
                "a client certificate that is not a node's (no {NODE_NAME} name)"
            )));
        }
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

fn config_err(path: &Path) -> impl FnOnce(rustls::Error) -> Error + '_ {
    move |source| Error::Config {
        dir: path.to_path_buf(),
        source,
    }
}

fn verifier_err(path: &Path) -> impl FnOnce(String) -> Error + '_ {
    move |why| Error::Verifier {
        path: path.to_path_buf(),
        why,
    }
}

/// The peer port's server side, from a node's TLS directory: presents the node's
/// certificate, requires a node certificate of the same CA, offers `alpn`.
pub fn peer_server_config(dir: &Path, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>> {
    let ca = dir.join(CA_CERT);
    let id = crate::Identity::node(dir);
    // The CA file is read again when it changes (crate::roots).
    let path = ca.clone();
    let inner = ReloadingClientVerifier::load(&ca, move |roots| {
        WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| verifier_err(&path)(e.to_string()))
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_err(&ca))?
        .with_client_cert_verifier(Arc::new(ClientIsNode(inner)))
        .with_cert_resolver(ReloadingIdentity::load(&id, provider())?);
    crate::config::no_resumption(&mut config);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A node dialling another, from its TLS directory: presents the node's
/// certificate, accepts only a node certificate of the same CA, asks for `alpn`.
pub fn peer_client_config(dir: &Path, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>> {
    let ca = dir.join(CA_CERT);
    let id = crate::Identity::node(dir);
    let path = ca.clone();
    let inner = ReloadingServerVerifier::load(&ca, move |roots| {
        let v: Arc<dyn ServerCertVerifier> =
            WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| verifier_err(&path)(e.to_string()))?;
        Ok(v)
    })?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_err(&ca))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerIsNode(inner)))
        .with_client_cert_resolver(ReloadingIdentity::load(&id, provider())?);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A client of a node's admin API (the CLI, `curl`-like tools): accepts only a node
/// certificate of the CA in `ca`, whatever address was dialled (users type
/// `127.0.0.1:7000`, a host name or a proxy's address, which a certificate need not
/// list); presents `id` when given (a client certificate of the CA).
pub fn admin_client_config(ca: &Path, id: Option<&crate::Identity>) -> Result<Arc<ClientConfig>> {
    let roots = crate::config::load_roots(ca)?;
    let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| verifier_err(ca)(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(config_err(ca))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerIsNode(inner)));
    let mut config = match id {
        None => builder.with_no_client_auth(),
        Some(id) => builder.with_client_cert_resolver(ReloadingIdentity::load(id, provider())?),
    };
    config.alpn_protocols = vec![ALPN_HTTP.to_vec()];
    Ok(Arc::new(config))
}

/// The server name a node dials another by (any name works: see the module doc).
pub fn peer_server_name() -> ServerName<'static> {
    node_name()
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
