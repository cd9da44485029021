//! Real handshakes between node-to-node configurations over an in-memory pipe.
use super::*;
use crate::files::load_certs;
use crate::{Ca, NodeNames};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Issue a node directory from `ca` into `dir`, valid for 127.0.0.1 only.
fn node_dir(ca: &Ca, dir: &Path, name: &str) {
    let names = NodeNames {
        name: name.into(),
        hosts: vec!["127.0.0.1".into()],
    };
    ca.issue_node(&names, 1)
        .unwrap()
        .write_node(ca, dir)
        .unwrap();
}

/// Handshake with `dialled` as the server name, then one byte each way: the
/// negotiated ALPN protocol, or why it failed (either side).
async fn shake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    dialled: &str,
) -> std::result::Result<Option<Vec<u8>>, String> {
    let (a, b) = tokio::io::duplex(1 << 16);
    let srv = tokio::spawn(async move {
        let mut s = TlsAcceptor::from(server)
            .accept(a)
            .await
            .map_err(|e| format!("server: {e}"))?;
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        s.write_all(&byte).await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    });
    let name = ServerName::try_from(dialled.to_string()).unwrap();
    let cli = async {
        let mut c = TlsConnector::from(client)
            .connect(name, b)
            .await
            .map_err(|e| format!("client: {e}"))?;
        c.write_all(b"x").await.map_err(|e| e.to_string())?;
        c.flush().await.map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        c.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(c.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    };
    let alpn = cli.await;
    let served = srv.await.unwrap();
    served?;
    alpn
}

#[tokio::test]
async fn test_two_nodes_of_one_ca_talk_whatever_address_was_dialled() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::generate("ca", 1).unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    node_dir(&ca, &a, "node1");
    node_dir(&ca, &b, "node2");
    let server = peer_server_config(&a, &[ALPN_PEER, ALPN_HTTP]).unwrap();
    // A proxy's address is in no certificate: the node name is what is checked.
    for dialled in ["10.9.8.7", "proxy.example", NODE_NAME] {
        let client = peer_client_config(&b, &[ALPN_PEER]).unwrap();
        let alpn = shake(server.clone(), client, dialled).await.unwrap();
        assert_eq!(alpn.as_deref(), Some(ALPN_PEER), "{dialled}");
    }
    let client = peer_client_config(&b, &[ALPN_HTTP]).unwrap();
    let alpn = shake(server, client, "127.0.0.1").await.unwrap();
    assert_eq!(alpn.as_deref(), Some(ALPN_HTTP));
}

#[tokio::test]
async fn test_a_node_of_another_ca_is_refused_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::generate("ca", 1).unwrap();
    let other = Ca::generate("other", 1).unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    node_dir(&ca, &a, "node1");
    node_dir(&other, &b, "intruder");
    let err = shake(
        peer_server_config(&a, &[ALPN_PEER]).unwrap(),
        peer_client_config(&b, &[ALPN_PEER]).unwrap(),
        NODE_NAME,
    )
    .await
    .unwrap_err();
    assert!(err.contains("Unknown"), "{err}");
    // The intruder as the server: our node refuses it.
    let err = shake(
        peer_server_config(&b, &[ALPN_PEER]).unwrap(),
        peer_client_config(&a, &[ALPN_PEER]).unwrap(),
        NODE_NAME,
    )
    .await
    .unwrap_err();
    assert!(err.contains("Unknown"), "{err}");
}

#[tokio::test]
async fn test_a_client_certificate_of_the_cluster_ca_is_not_a_node() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::generate("ca", 1).unwrap();
    let a = tmp.path().join("a");
    node_dir(&ca, &a, "node1");
    // A hypervisor's NBD client certificate, laid out as a node directory.
    let c = tmp.path().join("c");
    let issued = ca.issue_client("hypervisor1", 1).unwrap();
    crate::files::create_dir(&c).unwrap();
    crate::files::write_private(&c.join(CA_CERT), ca.cert_pem(), false).unwrap();
    crate::files::write_private(&c.join(crate::SERVER_CERT), &issued.cert_pem, false).unwrap();
    crate::files::write_private(&c.join(crate::SERVER_KEY), &issued.key_pem, false).unwrap();
    assert!(!is_node_cert(
        &load_certs(&c.join(crate::SERVER_CERT)).unwrap()[0]
    ));
    assert!(is_node_cert(
        &load_certs(&a.join(crate::SERVER_CERT)).unwrap()[0]
    ));
    let err = shake(
        peer_server_config(&a, &[ALPN_PEER]).unwrap(),
        peer_client_config(&c, &[ALPN_PEER]).unwrap(),
        NODE_NAME,
    )
    .await
    .unwrap_err();
    assert!(err.contains("not a node"), "{err}");
}

/// An expired certificate of the cluster CA is refused on every port: on the peer
/// port both ways (an expired node dialling in, a node dialling an expired one);
/// on the NBD TCP port (client certificate required) and the admin API (optional,
/// but one that is sent must be valid); and by the CLI dialling an admin API whose
/// node certificate expired. Without a client certificate the admin API lets the
/// CLI in: its tokens decide.
#[tokio::test]
async fn test_an_expired_certificate_is_refused_on_every_port() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::generate("ca", 1).unwrap();
    let good = tmp.path().join("good");
    node_dir(&ca, &good, "node1");
    let old = tmp.path().join("old");
    ca.issue_expired("node2", true)
        .unwrap()
        .write_node(&ca, &old)
        .unwrap();
    let old_client = tmp.path().join("old-client");
    ca.issue_expired("vm-host", false)
        .unwrap()
        .write_client(&ca, &old_client)
        .unwrap();
    let expired = |e: &str| e.to_lowercase().contains("expired");

    let err = shake(
        peer_server_config(&good, &[ALPN_PEER]).unwrap(),
        peer_client_config(&old, &[ALPN_PEER]).unwrap(),
        NODE_NAME,
    )
    .await
    .unwrap_err();
    assert!(expired(&err), "an expired node dialling in: {err}");
    let err = shake(
        peer_server_config(&old, &[ALPN_PEER]).unwrap(),
        peer_client_config(&good, &[ALPN_PEER]).unwrap(),
        NODE_NAME,
    )
    .await
    .unwrap_err();
    assert!(expired(&err), "dialling an expired node: {err}");

    let old_id = crate::Identity::client(&old_client);
    for auth in [crate::ClientAuth::Required, crate::ClientAuth::Optional] {
        let server = crate::node_server_config(&good, auth).unwrap();
        let client = crate::client_config(&good.join(CA_CERT), Some(&old_id)).unwrap();
        let err = shake(server, client, "127.0.0.1").await.unwrap_err();
        assert!(expired(&err), "{auth:?}, an expired client: {err}");
    }

    let server = crate::node_server_config(&good, crate::ClientAuth::Optional).unwrap();
    let cli = admin_client_config(&good.join(CA_CERT), None).unwrap();
    shake(server, cli, "10.1.2.3")
        .await
        .expect("the CLI without a client certificate, any address dialled");
    let server = crate::node_server_config(&old, crate::ClientAuth::Optional).unwrap();
    let cli = admin_client_config(&old.join(CA_CERT), None).unwrap();
    let err = shake(server, cli, "127.0.0.1").await.unwrap_err();
    assert!(expired(&err), "the CLI dialling an expired node: {err}");
}
