//! An NBD server on an in-memory duplex stream, one connection per call, for protocol
//! tests driven by the hand-written client.
use super::client::Client;
use super::MemExports;
use drove_metrics::Metrics;
use drove_nbd::{Exports, Server};
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;

pub const SIZE: u64 = 1 << 20;

pub struct Fixture {
    pub exports: Arc<MemExports>,
    pub metrics: Arc<Metrics>,
    pub server: Arc<Server>,
}

pub fn fixture() -> Fixture {
    let exports = MemExports::with(&[("d", SIZE, "test")]);
    let metrics = Metrics::new();
    let server = Arc::new(Server::new(
        Arc::clone(&exports) as Arc<dyn Exports>,
        Arc::clone(&metrics),
    ));
    Fixture {
        exports,
        metrics,
        server,
    }
}

impl Fixture {
    pub fn connect(&self) -> (DuplexStream, JoinHandle<io::Result<()>>) {
        let (client, server_side) = tokio::io::duplex(1 << 20);
        let server = Arc::clone(&self.server);
        let h = tokio::spawn(async move { server.serve_connection(server_side, "test").await });
        (client, h)
    }

    /// A connection served as a TCP one (TLS as the server was built with).
    pub fn connect_tcp(&self) -> (DuplexStream, JoinHandle<io::Result<()>>) {
        let (client, server_side) = tokio::io::duplex(1 << 20);
        let server = Arc::clone(&self.server);
        let h = tokio::spawn(async move { server.serve_tcp_connection(server_side, "test").await });
        (client, h)
    }

    pub async fn go(
        &self,
        structured: bool,
        meta: bool,
    ) -> (Client<DuplexStream>, JoinHandle<io::Result<()>>) {
        let (s, h) = self.connect();
        (Client::go(s, "d", structured, meta).await.unwrap(), h)
    }
}

pub async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("timed out")
}
