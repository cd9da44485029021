//! Where the CLI's NBD traffic goes (`vdi import`, `export`, `export-diff`,
//! `import-diff`): a node's unix socket when this host has it and this user may use
//! it, else the node's TCP port, with TLS and the CLI's client certificate when
//! `DROVE_CA` is a directory holding one. A node with certificates requires TLS on
//! TCP (`--nbd-tls require`, the default), so without that directory these commands
//! work only on the node's own host.
//!
//! The same choice is written three ways, one per client: [`Target`] for the CLI's
//! own client ([`crate::nbd_client`]), a `json:` filename and a `--object
//! tls-creds-x509` for qemu-img, and an `nbds://...?tls-certificates=` URI for
//! libnbd's nbdcopy.
use anyhow::{anyhow, bail, Result};
use drove_types::{NodeId, NodeState};
use rustls::pki_types::ServerName;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::client::Ctx;

/// Where a node's NBD server listens, as this host reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// The node's unix socket (it exists on this host).
    Unix(PathBuf),
    /// The node's TCP address, with the directory of the client certificate when
    /// TLS is spoken.
    Tcp {
        /// `host:port` as the cluster map has it.
        addr: String,
        /// `ca-cert.pem`, `client-cert.pem`, `client-key.pem`; `None`: plaintext.
        tls: Option<PathBuf>,
    },
}

impl Target {
    /// How the data travels, for summaries: `unix`, `tcp` or `tls`.
    pub(crate) fn via(&self) -> &'static str {
        match self {
            Target::Unix(_) => "unix",
            Target::Tcp { tls: None, .. } => "tcp",
            Target::Tcp { tls: Some(_), .. } => "tls",
        }
    }
}

/// A node's NBD server as this host reaches it.
#[derive(Debug, Clone)]
pub(crate) struct NodeNbd {
    /// The node.
    pub(crate) id: NodeId,
    /// Its admin API address.
    pub(crate) admin: String,
    /// Its NBD server.
    pub(crate) target: Target,
}

/// The NBD server of node `node` (the --cluster node when `None`).
pub(crate) async fn target_of(ctx: &Ctx, node: Option<u64>) -> Result<NodeNbd> {
    let s: drove_daemon::api::Status = ctx.get("/api/status").await?;
    let id = node.map(NodeId).unwrap_or(s.node_id);
    let Some(n) = s.map.node(id) else {
        let ids: Vec<String> = s.map.nodes.keys().map(|k| k.to_string()).collect();
        bail!("No node {id} in the cluster (nodes: {})", ids.join(", "));
    };
    if n.state == NodeState::Down {
        bail!("Node {id} is down; pick another with --node");
    }
    if n.witness {
        bail!(
            "Node {id} is a witness: it only votes in the metadata and serves no NBD; \
             pick a data node with --node (or --cluster)"
        );
    }
    let target = choose(Path::new(&n.nbd_socket), &n.nbd_addr, ctx.nbd_tls_dir());
    Ok(NodeNbd {
        id,
        admin: n.admin_addr.clone(),
        target,
    })
}

/// The unix socket when this user may connect to it here (the path exists only on
/// the node's own host; its mode may leave this user out), else TCP, with TLS when
/// there is a client certificate.
fn choose(socket: &Path, addr: &str, tls: Option<&Path>) -> Target {
    use rustix::fs::Access;
    // Connecting to a unix socket needs write permission on its file.
    if rustix::fs::access(socket, Access::READ_OK | Access::WRITE_OK).is_ok() {
        return Target::Unix(socket.to_path_buf());
    }
    Target::Tcp {
        addr: addr.to_string(),
        tls: tls.map(Path::to_path_buf),
    }
}

/// What the user is told when a node's TCP port wants TLS and the CLI has no
/// client certificate.
pub(crate) const NEEDS_CERT: &str = "NBD over TCP requires TLS with a client certificate \
     here: set DROVE_CA (or --ca) to a directory holding ca-cert.pem, client-cert.pem \
     and client-key.pem (`drove up` prints one; `drove cert client` makes one), or run \
     this on the node's own host (its unix socket)";

/// The host of `host:port` (`[v6]:port` too), as a TLS server name.
pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_string())
        .map_err(|e| anyhow!("Cannot use '{host}' of {addr} as a TLS server name: {e}"))
}

/// The rustls client of NBD over TLS: trusting the CA of `dir`, presenting its
/// client certificate.
pub(crate) fn client_config(dir: &Path) -> Result<Arc<rustls::ClientConfig>> {
    let id = drove_tls::Identity::client(dir);
    drove_tls::client_config(&dir.join(drove_tls::CA_CERT), Some(&id)).map_err(|e| {
        anyhow!(
            "Cannot use the client certificate of DROVE_CA {}: {e}",
            dir.display()
        )
    })
}

/// How qemu-img opens VDI `vdi` at `target`: its `--object` arguments (TLS
/// credentials) and the filename.
pub(crate) fn qemu_spec(target: &Target, vdi: &str) -> Result<(Vec<OsString>, String)> {
    match target {
        Target::Unix(p) => Ok((
            Vec::new(),
            format!("nbd+unix:///{vdi}?socket={}", escape(&p.to_string_lossy())),
        )),
        Target::Tcp { addr, tls: None } => Ok((Vec::new(), format!("nbd://{addr}/{vdi}"))),
        Target::Tcp {
            addr,
            tls: Some(dir),
        } => {
            let (host, port) = host_port(addr)?;
            // QEMU's option syntax doubles commas inside a value.
            let dir = dir.to_string_lossy().replace(',', ",,");
            let object = format!("tls-creds-x509,id=drove-tls,endpoint=client,dir={dir}");
            // A `json:` filename carries the NBD options (tls-creds among them) where a
            // plain filename goes, so `-f raw` / `-O raw` still name the format.
            let file = serde_json::json!({
                "file": {
                    "driver": "nbd",
                    "server": {"type": "inet", "host": host, "port": port},
                    "export": vdi,
                    "tls-creds": "drove-tls",
                }
            });
            Ok((
                vec![OsString::from("--object"), OsString::from(object)],
                format!("json:{file}"),
            ))
        }
    }
}

/// libnbd's URI (nbdcopy) of VDI `vdi` at `target`.
pub(crate) fn libnbd_uri(target: &Target, vdi: &str) -> String {
    match target {
        Target::Unix(p) => format!("nbd+unix:///{vdi}?socket={}", escape(&p.to_string_lossy())),
        Target::Tcp { addr, tls: None } => format!("nbd://{addr}/{vdi}"),
        Target::Tcp {
            addr,
            tls: Some(dir),
        } => format!(
            "nbds://{addr}/{vdi}?tls-certificates={}",
            escape(&dir.to_string_lossy())
        ),
    }
}

/// `host` and `port` of `host:port` or `[v6]:port`.
fn host_port(addr: &str) -> Result<(String, String)> {
    let Some((host, port)) = addr.rsplit_once(':') else {
        bail!("The node's NBD address '{addr}' has no port");
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Ok((host.to_string(), port.to_string()))
}

/// Percent-encode a path for a URI's query (qemu and libnbd decode it).
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"/._~-".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// An error of qemu-img or nbdcopy as a sentence: a node that wants TLS from a CLI
/// without a client certificate is named as such, not as the tool's raw message.
pub(crate) fn explain(target: &Target, node: NodeId, e: anyhow::Error) -> anyhow::Error {
    let said = format!("{e:#}");
    let tls_refused = said.contains("TLS negotiation required")
        || said.contains("TLS is required")
        || said.contains("server requires TLS");
    match target {
        Target::Tcp { tls: None, .. } if tls_refused => {
            anyhow!("Node {node}: {NEEDS_CERT}")
        }
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_escape_keeps_paths_and_encodes_uri_specials() {
        assert_eq!(escape("/a/b-c_d.sock"), "/a/b-c_d.sock");
        assert_eq!(escape("/a b/x&y?"), "/a%20b/x%26y%3F");
    }

    #[test]
    fn test_a_missing_socket_means_tcp_with_the_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let certs = dir.path().join("tls");
        let t = choose(&sock, "10.0.0.5:7002", Some(&certs));
        assert_eq!(
            t,
            Target::Tcp {
                addr: "10.0.0.5:7002".into(),
                tls: Some(certs.clone())
            }
        );
        assert_eq!(t.via(), "tls");
        assert_eq!(choose(&sock, "10.0.0.5:7002", None).via(), "tcp");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(choose(&sock, "10.0.0.5:7002", Some(&certs)).via(), "unix");
    }

    #[test]
    fn test_qemu_and_libnbd_get_the_tls_credentials() {
        let t = Target::Tcp {
            addr: "[::1]:7002".into(),
            tls: Some(PathBuf::from("/etc/drove/a,b")),
        };
        let (objects, file) = qemu_spec(&t, "vm1").unwrap();
        assert_eq!(
            objects,
            vec![
                OsString::from("--object"),
                OsString::from("tls-creds-x509,id=drove-tls,endpoint=client,dir=/etc/drove/a,,b")
            ]
        );
        let v: serde_json::Value =
            serde_json::from_str(file.strip_prefix("json:").unwrap()).unwrap();
        assert_eq!(v["file"]["server"]["host"], "::1");
        assert_eq!(v["file"]["server"]["port"], "7002");
        assert_eq!(v["file"]["tls-creds"], "drove-tls");
        assert_eq!(v["file"]["export"], "vm1");
        assert_eq!(
            libnbd_uri(&t, "vm1"),
            "nbds://[::1]:7002/vm1?tls-certificates=/etc/drove/a%2Cb"
        );
        let plain = Target::Tcp {
            addr: "h:1".into(),
            tls: None,
        };
        assert_eq!(
            qemu_spec(&plain, "v").unwrap(),
            (vec![], "nbd://h:1/v".into())
        );
    }

    #[test]
    fn test_server_names_come_from_the_address() {
        assert!(matches!(
            server_name("127.0.0.1:7002").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:7002").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("node1.example:7002").unwrap(),
            ServerName::DnsName(_)
        ));
    }
}
