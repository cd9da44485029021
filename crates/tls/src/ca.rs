//! The cluster CA: a self-signed ECDSA P-256 certificate whose key signs node
//! certificates (server and client authentication, for NBD now and peer traffic
//! later) and client certificates (client authentication, CN = the client's name).
//!
//! Key usages are the ones QEMU checks when it loads `tls-creds-x509`: it refuses a
//! leaf whose critical key usage lacks digital signature or key encipherment, and a
//! CA without certificate signing.
use crate::files::{check_absent, create_dir, load_certs, load_key_pem, write_private};
use crate::{Error, Result, CA_CERT, CA_KEY, CLIENT_CERT, CLIENT_KEY, NODE_NAME};
use crate::{SERVER_CERT, SERVER_KEY};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// Clock skew tolerated between the host that issues and the hosts that verify.
const BACKDATE: Duration = Duration::hours(1);

/// A CA that can issue certificates: its certificate and signing key.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Ca").field("issuer", &self.issuer).finish()
    }
}

/// The names a node certificate is valid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNames {
    /// The node's name (the certificate's CN), e.g. `node1`.
    pub name: String,
    /// IP addresses and DNS names clients dial it by; [`NODE_NAME`] is always added.
    pub hosts: Vec<String>,
}

/// A certificate just issued, with its new key.
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
    /// When it expires.
    pub not_after: OffsetDateTime,
}

fn gen(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Generate { what, source }
}

/// A certificate name must be short printable ASCII: it ends up in logs, in access
/// lists and in the CN, whose upper bound is 64 characters.
fn check_name(name: &str) -> Result<()> {
    let bad = |why| {
        Err(Error::BadName {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() || name.len() > 64 {
        return bad("use 1 to 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
    {
        return bad("use letters, digits and - _ . @ only");
    }
    Ok(())
}

fn san(host: &str) -> Result<SanType> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !ok {
        return Err(Error::BadName {
            name: host.to_string(),
            why: "not an IP address or a DNS name",
        });
    }
    let name = host.to_string().try_into().map_err(gen("a DNS name"))?;
    Ok(SanType::DnsName(name))
}

fn dn(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "drove");
    dn.push(DnType::CommonName, cn);
    dn
}

fn validity(params: &mut CertificateParams, days: u32) -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::days(i64::from(days.max(1)));
    params.not_after
}

impl Ca {
    /// A new CA named `name` (its CN), valid for `days`.
    pub fn generate(name: &str, days: u32) -> Result<Ca> {
        check_name(name)?;
        let key = KeyPair::generate().map_err(gen("the CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, days);
        let cert = params
            .self_signed(&key)
            .map_err(gen("the CA certificate"))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA in `dir`: `ca-cert.pem` and `ca-key.pem`. Any CA works (one of your
    /// own too) as long as the key is the certificate's and it may sign certificates.
    pub fn load(dir: &Path) -> Result<Ca> {
        let cert_path = dir.join(CA_CERT);
        let key_path = dir.join(CA_KEY);
        let certs = load_certs(&cert_path)?;
        let key_pem = load_key_pem(&key_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| Error::Invalid {
            path: key_path.clone(),
            why: format!("not a usable private key: {e}"),
        })?;
        let (_, x509) =
            x509_parser::parse_x509_certificate(&certs[0]).map_err(|e| Error::Invalid {
                path: cert_path.clone(),
                why: format!("not an X.509 certificate: {e}"),
            })?;
        if !x509.is_ca() {
            return Err(Error::Invalid {
                path: cert_path,
                why: "not a CA certificate (no basicConstraints CA:TRUE)".into(),
            });
        }
        if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(Error::Invalid {
                path: key_path,
                why: format!("not the key of {}", cert_path.display()),
            });
        }
        let issuer = Issuer::from_ca_cert_der(&certs[0], key).map_err(|e| Error::Invalid {
            path: cert_path.clone(),
            why: format!("cannot sign with this CA: {e}"),
        })?;
        // Keep the file's own text: it is what clients are handed.
        let cert_pem =
            String::from_utf8(crate::files::read_pem(&cert_path)?).map_err(|_| Error::Invalid {
                path: cert_path,
                why: "not a PEM text file".into(),
            })?;
        Ok(Ca {
            cert_pem,
            key_pem,
            issuer,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Write `ca-cert.pem` and `ca-key.pem` into `dir` (made 0700 if new); refuses
    /// to replace either. Returns the two paths.
    pub fn write(&self, dir: &Path) -> Result<[PathBuf; 2]> {
        let paths = [dir.join(CA_CERT), dir.join(CA_KEY)];
        create_dir(dir)?;
        check_absent(&paths)?;
        write_private(&paths[0], &self.cert_pem, false)?;
        write_private(&paths[1], &self.key_pem, false)?;
        Ok(paths)
    }

    fn issue(&self, mut params: CertificateParams, days: u32) -> Result<Issued> {
        validity(&mut params, days);
        self.sign(params)
    }

    /// Sign `params` (its validity set) with a new key.
    fn sign(&self, mut params: CertificateParams) -> Result<Issued> {
        let key = KeyPair::generate().map_err(gen("a key"))?;
        let not_after = params.not_after;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(gen("a certificate"))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after,
        })
    }

    /// A node certificate: server and client authentication, valid for the node's
    /// hosts and [`NODE_NAME`].
    pub fn issue_node(&self, names: &NodeNames, days: u32) -> Result<Issued> {
        self.issue(node_params(names)?, days)
    }

    /// A client certificate: client authentication only, CN = `name`.
    pub fn issue_client(&self, name: &str, days: u32) -> Result<Issued> {
        self.issue(client_params(name)?, days)
    }

    /// A node (`node`) or client certificate that expired a day ago (valid for
    /// the ten days before): what the tests show every port refuses.
    #[cfg(test)]
    pub(crate) fn issue_expired(&self, name: &str, node: bool) -> Result<Issued> {
        let mut params = if node {
            node_params(&NodeNames {
                name: name.to_string(),
                hosts: vec!["127.0.0.1".to_string()],
            })?
        } else {
            client_params(name)?
        };
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::days(11);
        params.not_after = now - Duration::days(1);
        self.sign(params)
    }
}

/// What a node certificate says: server and client authentication, the node's
/// hosts and [`NODE_NAME`].
fn node_params(names: &NodeNames) -> Result<CertificateParams> {
    check_name(&names.name)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(&names.name);
    let mut sans = vec![san(NODE_NAME)?];
    for h in &names.hosts {
        let s = san(h)?;
        if !sans.contains(&s) {
            sans.push(s);
        }
    }
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    Ok(params)
}

/// What a client certificate says: client authentication only, CN = `name`.
fn client_params(name: &str) -> Result<CertificateParams> {
    check_name(name)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params)
}

impl Issued {
    /// Write a node's directory (what `drove node run --tls-dir` reads):
    /// `ca-cert.pem`, `server-cert.pem`, `server-key.pem`. Refuses to replace any.
    pub fn write_node(&self, ca: &Ca, dir: &Path) -> Result<[PathBuf; 3]> {
        self.write_set(ca, dir, [CA_CERT, SERVER_CERT, SERVER_KEY])
    }

    /// Write a client's directory (what QEMU's `tls-creds-x509,endpoint=client,dir=`
    /// and libnbd's `tls-certificates=` read): `ca-cert.pem`, `client-cert.pem`,
    /// `client-key.pem`. Refuses to replace any.
    pub fn write_client(&self, ca: &Ca, dir: &Path) -> Result<[PathBuf; 3]> {
        self.write_set(ca, dir, [CA_CERT, CLIENT_CERT, CLIENT_KEY])
    }

    fn write_set(&self, ca: &Ca, dir: &Path, names: [&str; 3]) -> Result<[PathBuf; 3]> {
        let paths = names.map(|n| dir.join(n));
        create_dir(dir)?;
        // The CA certificate may already be there (the CA's own directory, or a
        // client and a node sharing one): the same one is kept, another is refused.
        let ca_same = std::fs::read_to_string(&paths[0]).is_ok_and(|t| t == ca.cert_pem);
        check_absent(if ca_same { &paths[1..] } else { &paths[..] })?;
        if !ca_same {
            write_private(&paths[0], &ca.cert_pem, false)?;
        }
        write_private(&paths[1], &self.cert_pem, false)?;
        write_private(&paths[2], &self.key_pem, false)?;
        Ok(paths)
    }
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
