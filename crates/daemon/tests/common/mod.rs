//! Shared by the admin-listener tests: an [`AdminServer`] on 127.0.0.1:0 serving a
//! small router, and raw HTTP/1.1 over TCP (the tests send what a client would
//! not: partial headers, partial bodies, nothing at all).
#![allow(dead_code)]

use axum::routing::{get, post};
use axum::Router;
use drove_daemon::http_listen::{AdminLimits, AdminServer};
#[allow(unused_imports)] // each test binary uses its own part of the kit
pub use drove_testkit::wait_until_async as wait_until;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An admin server with `limits` over `GET /status` and `POST /echo` (answers the
/// body's length; takes up to 64 MiB like the metadata routes).
pub async fn start(
    limits: AdminLimits,
) -> (Arc<AdminServer>, SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let router = Router::new()
        .route("/status", get(|| async { "ok" }))
        .route(
            "/echo",
            post(|body: bytes::Bytes| async move { body.len().to_string() }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20));
    let server = AdminServer::new(limits);
    let task = tokio::spawn(server.clone().serve(l, router));
    (server, addr, task)
}

/// Read one response: its status and body (by Content-Length).
pub async fn response(s: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).await.unwrap(),
            1,
            "closed mid-response: {buf:?}"
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let status = head[9..12].parse().unwrap();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_string)
        })
        .map(|v| v.trim().parse::<usize>().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Connect to `to` from `from` (a loopback address: 127.0.0.2 stands for another
/// host).
pub async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// Send `raw` on a new connection and read the response.
pub async fn exchange(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    response(&mut s).await
}

/// Wait for the server to close `s`: the time it took, or `None` if it is still
/// open after `limit`. Whatever the server sends first is read and dropped.
pub async fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}
