//! Accepting TCP connections so that a listener survives abuse; used by the peer
//! server and by the node's admin HTTP listener.
//!
//! A failed `accept` does not end the loop: running out of file descriptors
//! (EMFILE) once made a node stop listening on its peer port for good, after
//! 19,800 idle admin connections; its peers saw it flap and the epoch went from 4 to
//! 19 in two minutes. On an error the loop logs (at most once a second), waits (10 ms,
//! doubling up to 1 s, so that a lasting shortage is not a busy loop) and tries
//! again. Connections over the limits ([`crate::admission`]: in all, per client
//! address, the share kept for the cluster's nodes and loopback) are closed at
//! once, which bounds what a flood of idle connections can hold and from where.
use crate::admission::{Admission, ConnLimits, Slot, Trusted};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// First wait after a failed accept.
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Longest wait after failed accepts in a row.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Says when a repeated event may be logged again: at most once per period, with
/// the number of events left unlogged in between.
#[derive(Debug)]
pub struct LogEvery {
    every: Duration,
    last: Option<Instant>,
    skipped: u64,
}

impl LogEvery {
    /// At most once per `every`.
    pub fn new(every: Duration) -> LogEvery {
        LogEvery {
            every,
            last: None,
            skipped: 0,
        }
    }

    /// `Some(skipped)` if this event may be logged (`skipped` events were not since
    /// the last one that was); `None` if it must not.
    pub fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            self.skipped += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.skipped))
    }
}

/// A listener with limits on open connections and an accept loop that never ends.
pub struct Acceptor {
    listener: TcpListener,
    admission: Arc<Admission>,
    what: &'static str,
    backoff: Duration,
    errors: LogEvery,
    refused: LogEvery,
}

impl Acceptor {
    /// Accept on `listener` within `limits`, `trusted` saying which addresses may
    /// take the reserved share; `what` names the listener in logs ("peer", "admin").
    pub fn new(
        listener: TcpListener,
        limits: ConnLimits,
        trusted: Arc<dyn Trusted>,
        what: &'static str,
    ) -> Acceptor {
        Acceptor {
            listener,
            admission: Admission::new(limits, trusted),
            what,
            backoff: MIN_BACKOFF,
            errors: LogEvery::new(Duration::from_secs(1)),
            refused: LogEvery::new(Duration::from_secs(1)),
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.admission.open()
    }

    /// The next connection within the limits, with its slot: drop the slot when
    /// the connection closes. Cancel-safe (the wait state lives in `self`).
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr, Slot) {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.backoff = MIN_BACKOFF;
                    match self.admission.admit(peer.ip()) {
                        Ok(slot) => return (stream, peer, slot),
                        Err(refused) => {
                            // At most one line a second, whatever the flood.
                            if let Some(skipped) = self.refused.ready() {
                                tracing::warn!(
                                    %peer, skipped,
                                    "{} listener: closing new connections: {}",
                                    self.what,
                                    refused.why(self.admission.limits())
                                );
                            }
                            drop(stream);
                        }
                    }
                }
                // Errors about one connection that is already gone: take the next.
                Err(e) if is_per_connection(&e) => {}
                Err(e) => {
                    if let Some(skipped) = self.errors.ready() {
                        tracing::warn!(
                            skipped, backoff = ?self.backoff,
                            "{} listener: accept failed, retrying: {e}",
                            self.what
                        );
                    }
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

fn is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::LocalOnly;

    #[test]
    fn test_log_every_counts_what_it_holds_back() {
        let mut l = LogEvery::new(Duration::from_secs(3600));
        assert_eq!(l.ready(), Some(0));
        assert_eq!(l.ready(), None);
        assert_eq!(l.ready(), None);
        l.last = Some(Instant::now() - Duration::from_secs(3601));
        assert_eq!(l.ready(), Some(2));
    }

    #[tokio::test]
    async fn test_connections_over_the_cap_are_closed_and_slots_come_back() {
        use tokio::io::AsyncReadExt;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut a = Acceptor::new(l, ConnLimits::new(1, 1), Arc::new(LocalOnly), "test");
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let (_s1, _, slot) = a.accept().await;
        assert_eq!(a.open(), 1);
        // Over the cap: closed at once; the acceptor keeps waiting for a slot's worth.
        let mut c2 = TcpStream::connect(addr).await.unwrap();
        let over = tokio::time::timeout(Duration::from_millis(300), a.accept()).await;
        assert!(over.is_err(), "a connection over the cap was handed out");
        let mut buf = [0u8; 1];
        assert_eq!(c2.read(&mut buf).await.unwrap(), 0, "closed at once");
        drop(slot);
        let _c3 = TcpStream::connect(addr).await.unwrap();
        let (_s3, _, _slot) = a.accept().await;
        assert_eq!(a.open(), 1);
    }
}

#[cfg(test)]
mod per_client_tests {
    use super::*;
    use crate::admission::LocalOnly;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpSocket;

    async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
        let s = TcpSocket::new_v4().unwrap();
        s.bind(format!("{from}:0").parse().unwrap()).unwrap();
        s.connect(to).await.unwrap()
    }

    /// Whether the acceptor closed `s` at once (it reads end of file).
    async fn closed(s: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_millis(500), s.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn test_a_flood_from_other_addresses_leaves_loopback_its_reserve() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = l.local_addr().unwrap();
        let limits = ConnLimits {
            max_conns: 6,
            per_client: 2,
            reserved: 2,
        };
        let mut a = Acceptor::new(l, limits, Arc::new(LocalOnly), "test");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let serve = tokio::spawn(async move {
            loop {
                let conn = a.accept().await;
                let _ = tx.send(conn);
            }
        });
        let mut kept = Vec::new();
        // 127.0.0.2 gets two, 127.0.0.3 two, 127.0.0.4 none: the shared four are taken.
        let mut refused = 0;
        for from in [
            "127.0.0.2",
            "127.0.0.2",
            "127.0.0.2",
            "127.0.0.3",
            "127.0.0.3",
        ] {
            let mut s = connect_from(from, to).await;
            if closed(&mut s).await {
                refused += 1;
            }
            kept.push(s);
        }
        assert_eq!(refused, 1, "the third from 127.0.0.2");
        let mut s = connect_from("127.0.0.4", to).await;
        assert!(closed(&mut s).await, "the shared part is full");
        // Loopback still gets the two reserved.
        for _ in 0..2 {
            let mut s = connect_from("127.0.0.1", to).await;
            assert!(!closed(&mut s).await, "refused from 127.0.0.1");
            kept.push(s);
        }
        let accepted: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(accepted.len(), 6);
        serve.abort();
    }
}
