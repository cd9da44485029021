//! A TCP relay in front of a real peer server that can be frozen: while frozen it
//! moves no byte either way and closes nothing, as the kernel of a stopped process
//! keeps its connections open and answers nothing.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A relay in front of one server.
pub struct Relay {
    /// Where to connect to reach the server through the relay.
    pub addr: SocketAddr,
    /// Set to freeze the relay, clear to let bytes flow again.
    pub frozen: Arc<AtomicBool>,
}

impl Relay {
    /// A relay to the server at `to`.
    pub async fn start(to: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = l.accept().await {
                let outbound = TcpStream::connect(to).await.unwrap();
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::spawn(pump(ri, wo, f.clone()));
                tokio::spawn(pump(ro, wi, f.clone()));
            }
        });
        Relay { addr, frozen }
    }
}

/// Copy what `from` sends to `to`, holding it while `frozen`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just before a freeze are held, not delivered.
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
