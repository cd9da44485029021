//! NBD_OPT_STARTTLS end to end on an in-memory stream: a rustls client upgrades the
//! connection, negotiates and moves data; the refusals of a TLS-only listener are
//! checked on the wire; the unix-socket path (`serve_connection`) never offers TLS.
mod common;

use common::client::{greet, read_opt_reply, Client};
use common::fixture::{within, Fixture};
use common::MemExports;
use drove_metrics::Metrics;
use drove_nbd::option::encode_option;
use drove_nbd::proto::*;
use drove_nbd::request::Command;
use drove_nbd::{Credential, Exports, Server, TlsMode};
use drove_tls::{Ca, ClientAuth, Identity, NodeNames};
use rustls_pki_types::ServerName;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

struct Certs {
    _dir: tempfile::TempDir,
    node: PathBuf,
    client: PathBuf,
}

fn certs() -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("ca", 1).unwrap();
    let node = dir.path().join("node");
    let names = NodeNames {
        name: "node1".into(),
        hosts: vec!["127.0.0.1".into()],
    };
    ca.issue_node(&names, 1)
        .unwrap()
        .write_node(&ca, &node)
        .unwrap();
    let client = dir.path().join("client");
    ca.issue_client("alice", 1)
        .unwrap()
        .write_client(&ca, &client)
        .unwrap();
    Certs {
        _dir: dir,
        node,
        client,
    }
}

fn fixture(mode: TlsMode, c: &Certs) -> Fixture {
    let exports = MemExports::with(&[("d", common::fixture::SIZE, "test")]);
    let metrics = Metrics::new();
    let config = drove_tls::config::node_server_config(&c.node, ClientAuth::Required).unwrap();
    let server = Server::new(
        Arc::clone(&exports) as Arc<dyn Exports>,
        Arc::clone(&metrics),
    )
    .with_tls(mode, config);
    Fixture {
        exports,
        metrics,
        server: Arc::new(server),
    }
}

fn connector(c: &Certs) -> tokio_rustls::TlsConnector {
    let id = Identity::client(&c.client);
    let cfg = drove_tls::client_config(&c.client.join(drove_tls::CA_CERT), Some(&id)).unwrap();
    tokio_rustls::TlsConnector::from(cfg)
}

async fn option(s: &mut tokio::io::DuplexStream, code: u32, data: &[u8]) -> u32 {
    s.write_all(&encode_option(code, data)).await.unwrap();
    read_opt_reply(s).await.unwrap().0
}

#[tokio::test]
async fn test_starttls_then_go_moves_data_over_tls() {
    let c = certs();
    let f = fixture(TlsMode::Require, &c);
    let (mut s, h) = f.connect_tcp();
    within(async {
        greet(&mut s).await.unwrap();
        assert_eq!(option(&mut s, NBD_OPT_STARTTLS, &[]).await, NBD_REP_ACK);
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let tls = connector(&c).connect(name, s).await.unwrap();
        let mut cl = Client::go_greeted(tls, "d", true, false).await.unwrap();
        assert_eq!(cl.size, common::fixture::SIZE);
        let data = vec![0x5a; 4096];
        cl.send(Command::Write, 0, 1, 8192, 4096, &data)
            .await
            .unwrap();
        assert_eq!(cl.recv().await.unwrap().error(), 0);
        assert_eq!(f.exports.get("d").bytes(8192, 4096), data);
        cl.send(Command::Disc, 0, 2, 0, 0, &[]).await.unwrap();
    })
    .await;
    within(h).await.unwrap().unwrap();
}

#[tokio::test]
async fn test_tls_required_answers_tls_reqd_and_drops_export_name() {
    let c = certs();
    let f = fixture(TlsMode::Require, &c);
    let (mut s, _h) = f.connect_tcp();
    within(async {
        greet(&mut s).await.unwrap();
        assert_eq!(
            option(&mut s, NBD_OPT_LIST, &[]).await,
            NBD_REP_ERR_TLS_REQD
        );
        let mut go = 1u32.to_be_bytes().to_vec();
        go.extend_from_slice(b"d\0\0");
        assert_eq!(option(&mut s, NBD_OPT_GO, &go).await, NBD_REP_ERR_TLS_REQD);
    })
    .await;
    // The old-style EXPORT_NAME gets no export: the server closes.
    let (s, h) = f.connect_tcp();
    let r = within(Client::export_name(s, "d")).await;
    assert!(r.is_err(), "EXPORT_NAME before TLS got an export");
    assert!(within(h).await.unwrap().is_err());
}

#[tokio::test]
async fn test_plaintext_bytes_after_starttls_break_the_handshake() {
    // An option sent right behind STARTTLS, before any TLS: it must not be read as
    // an option (the server reads no further than the STARTTLS frame).
    let c = certs();
    let f = fixture(TlsMode::Require, &c);
    let (mut s, h) = f.connect_tcp();
    within(async {
        greet(&mut s).await.unwrap();
        let mut both = encode_option(NBD_OPT_STARTTLS, &[]);
        both.extend_from_slice(&encode_option(NBD_OPT_LIST, &[]));
        s.write_all(&both).await.unwrap();
        assert_eq!(read_opt_reply(&mut s).await.unwrap().0, NBD_REP_ACK);
    })
    .await;
    assert!(within(h).await.unwrap().is_err());
}

#[tokio::test]
async fn test_allow_serves_plaintext_and_the_unix_path_never_offers_tls() {
    let c = certs();
    let f = fixture(TlsMode::Allow, &c);
    let (s, _h) = f.connect_tcp();
    within(Client::go(s, "d", false, false)).await.unwrap();
    // serve_connection is the unix socket's: STARTTLS is refused by policy there.
    let f = fixture(TlsMode::Require, &c);
    let (mut s, _h) = f.connect();
    within(async {
        greet(&mut s).await.unwrap();
        assert_eq!(
            option(&mut s, NBD_OPT_STARTTLS, &[]).await,
            NBD_REP_ERR_POLICY
        );
    })
    .await;
    within(Client::go_greeted(s, "d", false, false))
        .await
        .unwrap();
}

/// The catalogue learns who opens an export: a TLS client by its certificate's
/// name, a plaintext TCP client as anonymous, a unix-socket client as local.
#[tokio::test]
async fn test_the_catalogue_sees_each_client_by_what_it_proved() {
    let c = certs();
    let f = fixture(TlsMode::Allow, &c);
    let (mut s, h) = f.connect_tcp();
    within(async {
        greet(&mut s).await.unwrap();
        assert_eq!(option(&mut s, NBD_OPT_STARTTLS, &[]).await, NBD_REP_ACK);
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let tls = connector(&c).connect(name, s).await.unwrap();
        let mut cl = Client::go_greeted(tls, "d", false, false).await.unwrap();
        cl.send(Command::Disc, 0, 1, 0, 0, &[]).await.unwrap();
    })
    .await;
    within(h).await.unwrap().unwrap();
    let (s, h) = f.connect_tcp();
    within(async {
        let mut cl = Client::go(s, "d", false, false).await.unwrap();
        cl.send(Command::Disc, 0, 2, 0, 0, &[]).await.unwrap();
    })
    .await;
    within(h).await.unwrap().unwrap();
    let (s, h) = f.connect();
    within(async {
        let mut cl = Client::go(s, "d", false, false).await.unwrap();
        cl.send(Command::Disc, 0, 3, 0, 0, &[]).await.unwrap();
    })
    .await;
    within(h).await.unwrap().unwrap();
    assert_eq!(
        *f.exports.opened_by.lock(),
        vec![
            Credential::Certificate(Some("alice".to_string())),
            Credential::Anonymous,
            Credential::Local,
        ]
    );
}
