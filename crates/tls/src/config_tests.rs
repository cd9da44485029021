//! Real TLS handshakes over an in-memory pipe between configurations built here.
use super::*;
use crate::{Ca, NodeNames};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

struct Dirs {
    _tmp: tempfile::TempDir,
    /// The CA of `node` and `client`, and the node's names.
    ca: Ca,
    names: NodeNames,
    node: PathBuf,
    client: PathBuf,
    stranger: PathBuf,
}

/// A node and a client of one CA, and a client of another CA.
fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::generate("ca", 1).unwrap();
    let names = NodeNames {
        name: "node1".into(),
        hosts: vec!["127.0.0.1".into()],
    };
    let node = tmp.path().join("node");
    ca.issue_node(&names, 1)
        .unwrap()
        .write_node(&ca, &node)
        .unwrap();
    let client = tmp.path().join("client");
    ca.issue_client("alice", 1)
        .unwrap()
        .write_client(&ca, &client)
        .unwrap();
    let other = Ca::generate("other", 1).unwrap();
    let stranger = tmp.path().join("stranger");
    other
        .issue_client("mallory", 1)
        .unwrap()
        .write_client(&other, &stranger)
        .unwrap();
    Dirs {
        _tmp: tmp,
        ca,
        names,
        node,
        client,
        stranger,
    }
}

/// Handshake, then one byte each way; the server's view of the client's CN.
async fn connect(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    name: &str,
) -> std::result::Result<Option<String>, String> {
    let (a, b) = tokio::io::duplex(1 << 16);
    let name = ServerName::try_from(name.to_string()).unwrap();
    let srv = tokio::spawn(async move {
        let mut s = TlsAcceptor::from(server)
            .accept(a)
            .await
            .map_err(|e| e.to_string())?;
        let cn = s
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| common_name(&c[0]));
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        s.write_all(&byte).await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(cn)
    });
    let cli = async {
        let mut c = TlsConnector::from(client)
            .connect(name, b)
            .await
            .map_err(|e| e.to_string())?;
        c.write_all(b"x").await.map_err(|e| e.to_string())?;
        c.flush().await.map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        c.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    };
    let cli = cli.await;
    let srv = srv.await.unwrap();
    cli?;
    srv
}

fn client_of(dir: &Path, with_cert: bool) -> Arc<ClientConfig> {
    let id = Identity::client(dir);
    client_config(&dir.join(CA_CERT), with_cert.then_some(&id)).unwrap()
}

#[tokio::test]
async fn test_required_client_auth_accepts_only_the_cas_clients() {
    let d = dirs();
    let server = node_server_config(&d.node, ClientAuth::Required).unwrap();
    let cn = connect(server.clone(), client_of(&d.client, true), "127.0.0.1").await;
    assert_eq!(cn, Ok(Some("alice".to_string())));
    // The node certificate is valid for drove-node too.
    assert!(
        connect(server.clone(), client_of(&d.client, true), "drove-node")
            .await
            .is_ok()
    );
    // No client certificate.
    assert!(
        connect(server.clone(), client_of(&d.client, false), "127.0.0.1")
            .await
            .is_err()
    );
    // A client certificate of another CA (which trusts our node, to get that far).
    let stranger = client_config(
        &d.client.join(CA_CERT),
        Some(&Identity::client(&d.stranger)),
    )
    .unwrap();
    assert!(connect(server, stranger, "127.0.0.1").await.is_err());
}

#[tokio::test]
async fn test_clients_check_the_server_name_and_ca() {
    let d = dirs();
    let server = node_server_config(&d.node, ClientAuth::Optional).unwrap();
    assert_eq!(
        connect(server.clone(), client_of(&d.client, false), "127.0.0.1").await,
        Ok(None)
    );
    assert!(
        connect(server.clone(), client_of(&d.client, true), "10.9.9.9")
            .await
            .is_err()
    );
    // A client trusting another CA refuses the node.
    assert!(connect(server, client_of(&d.stranger, false), "127.0.0.1")
        .await
        .is_err());
}

#[test]
fn test_missing_or_mismatched_files_are_errors() {
    let d = dirs();
    let e = node_server_config(&d.client, ClientAuth::Required).unwrap_err();
    assert!(e.to_string().contains("server-cert.pem"), "{e}");
    // A node certificate with the client's key.
    std::fs::remove_file(d.node.join(SERVER_KEY)).unwrap();
    std::fs::copy(d.client.join(CLIENT_KEY), d.node.join(SERVER_KEY)).unwrap();
    let e = node_server_config(&d.node, ClientAuth::Required).unwrap_err();
    assert!(matches!(e, Error::Config { .. }), "{e}");
}

/// The certificate the server presented to `client` in a full handshake.
async fn served(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
) -> std::result::Result<CertificateDer<'static>, String> {
    let (a, b) = tokio::io::duplex(1 << 16);
    let srv = tokio::spawn(async move {
        let mut s = TlsAcceptor::from(server)
            .accept(a)
            .await
            .map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    });
    let name = ServerName::try_from("127.0.0.1".to_string()).unwrap();
    let mut c = TlsConnector::from(client)
        .connect(name, b)
        .await
        .map_err(|e| e.to_string())?;
    let cert = c
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|v| v.first().cloned())
        .ok_or("no server certificate")?
        .into_owned();
    c.write_all(b"x").await.map_err(|e| e.to_string())?;
    c.flush().await.map_err(|e| e.to_string())?;
    srv.await.unwrap()?;
    Ok(cert)
}

#[tokio::test]
async fn test_a_replaced_node_certificate_is_served_without_a_restart() {
    let d = dirs();
    let node = &d.node;
    let server = node_server_config(node, ClientAuth::Required).unwrap();
    let client = client_of(&d.client, true);
    let first = served(server.clone(), client.clone()).await.unwrap();
    let wait = crate::reload::CHECK_EVERY + std::time::Duration::from_millis(200);

    // The new key first: for a while the files do not match, and the old pair
    // stays in use.
    let second = d.ca.issue_node(&d.names, 1).unwrap();
    std::fs::write(node.join(SERVER_KEY), &second.key_pem).unwrap();
    tokio::time::sleep(wait).await;
    let now = served(server.clone(), client.clone()).await.unwrap();
    assert_eq!(
        now, first,
        "a certificate with another key's pair was taken"
    );

    // Then the certificate: the next handshakes get it, same configuration.
    std::fs::write(node.join(SERVER_CERT), &second.cert_pem).unwrap();
    tokio::time::sleep(wait).await;
    let now = served(server.clone(), client.clone()).await.unwrap();
    assert_ne!(now, first, "the old certificate is still served");
    assert_eq!(now, load_certs(&node.join(SERVER_CERT)).unwrap()[0]);
}

/// Moving to a new CA without a restart: the node's CA file gains the new CA (its
/// clients get in from the next handshake, the old CA's still do), then loses the
/// old one (its clients are refused); a CA file that cannot be used is refused and
/// the roots in use stay. Same server configuration throughout.
#[tokio::test]
async fn test_a_ca_file_changed_while_the_node_runs_is_used_for_the_next_handshakes() {
    let d = dirs();
    let server = node_server_config(&d.node, ClientAuth::Required).unwrap();
    let wait = crate::reload::CHECK_EVERY + std::time::Duration::from_millis(200);
    let old_ca = std::fs::read_to_string(d.node.join(CA_CERT)).unwrap();
    let new = Ca::generate("new", 1).unwrap();
    let dir = d.client.parent().unwrap().join("new-client");
    new.issue_client("bob", 1)
        .unwrap()
        .write_client(&new, &dir)
        .unwrap();
    // Bob trusts the node (old CA) and presents a certificate of the new CA.
    let bob = client_config(&d.client.join(CA_CERT), Some(&Identity::client(&dir))).unwrap();
    let alice = client_of(&d.client, true);
    assert!(connect(server.clone(), bob.clone(), "127.0.0.1")
        .await
        .is_err());

    // Both CAs in the file.
    let both = format!("{old_ca}{}", new.cert_pem());
    std::fs::write(d.node.join(CA_CERT), &both).unwrap();
    tokio::time::sleep(wait).await;
    let cn = connect(server.clone(), bob.clone(), "127.0.0.1").await;
    assert_eq!(cn, Ok(Some("bob".to_string())));
    let cn = connect(server.clone(), alice.clone(), "127.0.0.1").await;
    assert_eq!(cn, Ok(Some("alice".to_string())));

    // A file that cannot be used: refused, the two CAs stay.
    std::fs::write(d.node.join(CA_CERT), "not a certificate\n").unwrap();
    tokio::time::sleep(wait).await;
    let cn = connect(server.clone(), bob.clone(), "127.0.0.1").await;
    assert_eq!(cn, Ok(Some("bob".to_string())));

    // The new CA only: the old CA's client is refused.
    std::fs::write(d.node.join(CA_CERT), new.cert_pem()).unwrap();
    tokio::time::sleep(wait).await;
    assert!(connect(server.clone(), alice, "127.0.0.1").await.is_err());
    let cn = connect(server, bob, "127.0.0.1").await;
    assert_eq!(cn, Ok(Some("bob".to_string())));
}
