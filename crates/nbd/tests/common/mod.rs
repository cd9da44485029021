//! Shared test fixtures: an in-memory export with a holes bitmap and optional delays
//! or failures, a catalogue of them, a server on a tempdir unix socket and on TCP
//! 127.0.0.1:0, and a minimal NBD client that parses replies on its own.
#![allow(dead_code)]

pub mod client;
pub mod fixture;

use async_trait::async_trait;
use bytes::Bytes;
use drove_metrics::Metrics;
use drove_nbd::{ClientInfo, Credential, Export, Exports, Extent, Server};
#[allow(unused_imports)] // each test binary uses its own part of the kit
pub use drove_testkit::require;
use drove_types::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Allocation granularity of [`MemExport`].
pub const BLK: u64 = 4096;

/// Bytes in memory; a block is a hole until written.
pub struct MemExport {
    data: Mutex<Vec<u8>>,
    allocated: Mutex<Vec<bool>>,
    /// Reads and writes at exactly this offset sleep this long first.
    pub slow_at: Mutex<Option<(u64, Duration)>>,
    /// Reads fail with this kind.
    pub fail_reads: Mutex<Option<ErrorKind>>,
    /// Writes finished so far.
    pub writes_done: AtomicU64,
    /// `writes_done` seen by each flush, in order.
    pub flushes: Mutex<Vec<u64>>,
    pub multi_conn: bool,
}

fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

impl MemExport {
    pub fn new(size: u64) -> Arc<Self> {
        Arc::new(MemExport {
            data: Mutex::new(vec![0; size as usize]),
            allocated: Mutex::new(vec![false; size.div_ceil(BLK) as usize]),
            slow_at: Mutex::new(None),
            fail_reads: Mutex::new(None),
            writes_done: AtomicU64::new(0),
            flushes: Mutex::new(Vec::new()),
            multi_conn: true,
        })
    }

    /// A copy of `[off, off + len)`.
    pub fn bytes(&self, off: u64, len: usize) -> Vec<u8> {
        lock(&self.data)[off as usize..off as usize + len].to_vec()
    }

    async fn maybe_slow(&self, off: u64) {
        let slow = *lock(&self.slow_at);
        if let Some((at, d)) = slow {
            if at == off {
                tokio::time::sleep(d).await;
            }
        }
    }

    /// Zero `[off, off + len)` and make the blocks it fully covers holes.
    fn punch(&self, off: u64, len: u64) {
        lock(&self.data)[off as usize..(off + len) as usize].fill(0);
        let first = off.div_ceil(BLK);
        let end = (off + len) / BLK;
        let mut a = lock(&self.allocated);
        for b in first..end {
            a[b as usize] = false;
        }
    }
}

#[async_trait]
impl Export for MemExport {
    fn size(&self) -> u64 {
        lock(&self.data).len() as u64
    }

    fn multi_conn(&self) -> bool {
        self.multi_conn
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes> {
        self.maybe_slow(offset).await;
        if let Some(kind) = *lock(&self.fail_reads) {
            return Err(Error::new(kind, "injected read failure"));
        }
        Ok(Bytes::from(self.bytes(offset, len as usize)))
    }

    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<()> {
        self.maybe_slow(offset).await;
        let end = offset + data.len() as u64;
        lock(&self.data)[offset as usize..end as usize].copy_from_slice(&data);
        let mut a = lock(&self.allocated);
        for b in offset / BLK..end.div_ceil(BLK) {
            a[b as usize] = true;
        }
        drop(a);
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u32, _fua: bool) -> Result<()> {
        self.punch(offset, u64::from(len));
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<()> {
        self.punch(offset, u64::from(len));
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let done = self.writes_done.load(Ordering::SeqCst);
        lock(&self.flushes).push(done);
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>> {
        let a = lock(&self.allocated);
        let end = offset + u64::from(len);
        let mut out: Vec<Extent> = Vec::new();
        let mut pos = offset;
        while pos < end {
            let b = pos / BLK;
            let next = ((b + 1) * BLK).min(end);
            let hole = !a[b as usize];
            match out.last_mut() {
                Some(e) if e.hole == hole => e.length += next - pos,
                _ => out.push(Extent {
                    length: next - pos,
                    hole,
                    zero: hole,
                }),
            }
            pos = next;
        }
        Ok(out)
    }
}

/// A catalogue of named in-memory exports.
#[derive(Default)]
pub struct MemExports {
    pub map: Mutex<BTreeMap<String, (Arc<MemExport>, String)>>,
    /// The credential of every client that opened an export, in order.
    pub opened_by: Mutex<Vec<Credential>>,
}

impl MemExports {
    pub fn with(exports: &[(&str, u64, &str)]) -> Arc<Self> {
        let me = MemExports::default();
        for (name, size, desc) in exports {
            lock(&me.map).insert(name.to_string(), (MemExport::new(*size), desc.to_string()));
        }
        Arc::new(me)
    }

    pub fn get(&self, name: &str) -> Arc<MemExport> {
        Arc::clone(&lock(&self.map)[name].0)
    }
}

#[async_trait]
impl Exports for MemExports {
    async fn list(&self, _client: &ClientInfo) -> Result<Vec<(String, String)>> {
        Ok(lock(&self.map)
            .iter()
            .map(|(n, (_, d))| (n.clone(), d.clone()))
            .collect())
    }

    async fn open(&self, name: &str, client: &ClientInfo) -> Result<Arc<dyn Export>> {
        lock(&self.opened_by).push(client.credential.clone());
        match lock(&self.map).get(name) {
            Some((e, _)) => Ok(Arc::clone(e) as Arc<dyn Export>),
            None => Err(Error::not_found(format!("no export named '{name}'"))),
        }
    }
}

/// A running server with `disk0` (64 MiB) and `disk1` (16 MiB).
pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub tcp: SocketAddr,
    pub exports: Arc<MemExports>,
    pub server: Arc<Server>,
    pub metrics: Arc<Metrics>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        let exports = MemExports::with(&[
            ("disk0", 64 << 20, "first test disk"),
            ("disk1", 16 << 20, "second test disk"),
        ]);
        let metrics = Metrics::new();
        let server = Arc::new(Server::new(
            Arc::clone(&exports) as Arc<dyn Exports>,
            Arc::clone(&metrics),
        ));
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let unix = tokio::net::UnixListener::bind(&sock).unwrap();
        let tcp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = tcp_listener.local_addr().unwrap();
        tokio::spawn(Arc::clone(&server).serve_unix(unix));
        tokio::spawn(Arc::clone(&server).serve_tcp(tcp_listener));
        TestServer {
            dir,
            sock,
            tcp,
            exports,
            server,
            metrics,
        }
    }

    pub fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    pub fn tcp_uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.tcp)
    }
}

/// The output of a client run.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Run a client with a deadline (a hang is a failure, never a pass).
pub async fn run(prog: &str, args: &[&str]) -> Run {
    let child = tokio::process::Command::new(prog)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), child)
        .await
        .unwrap_or_else(|_| panic!("{prog} {args:?} hung"))
        .unwrap_or_else(|e| panic!("{prog} failed to start: {e}"));
    let r = Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    if !r.ok {
        println!("{prog} {args:?} failed:\n{}\n{}", r.stdout, r.stderr);
    }
    r
}
