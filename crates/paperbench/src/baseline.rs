//! The centralized baseline: the "one iSCSI/NFS box" of today's hosting, as one
//! qemu-nbd server per client disk (a raw file each), all in zone 1. Clients in
//! zone 1 connect to it directly over TCP; clients of other zones reach it through
//! a WAN proxy, the same WAN as drove's nodes see.
use anyhow::{Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::procs::{free_port, wait_port, Cancel, ProcGuard};
use crate::toxiproxy::Toxiproxy;
use crate::wan::client_zone;

/// How client `i` reaches its baseline disk.
#[derive(Clone, Debug)]
pub struct BaseClient {
    /// Zone of the client (1-based).
    pub zone: usize,
    /// NBD URI fio uses.
    pub uri: String,
    /// The qemu-nbd server's own address.
    pub server: String,
    /// Proxy name and listen address, for clients outside zone 1.
    pub proxy: Option<(String, String)>,
}

/// The running baseline servers, killed when dropped.
#[derive(Debug)]
pub struct Baseline {
    servers: Vec<ProcGuard>,
    /// One entry per client, in client order.
    pub clients: Vec<BaseClient>,
}

/// Name of the baseline proxy of client `i`; all start with `base-`.
pub fn proxy_name(i: usize) -> String {
    format!("base-c{i}")
}

impl Baseline {
    /// Start `clients` qemu-nbd servers on raw files of `size` bytes in `dir`.
    pub fn start(
        dir: &Path,
        clients: usize,
        zones: usize,
        size: u64,
        toxi: &Toxiproxy,
        cancel: &Cancel,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("Cannot create {}", dir.display()))?;
        let mut b = Baseline {
            servers: Vec::new(),
            clients: Vec::new(),
        };
        for i in 0..clients {
            cancel.check()?;
            let name = format!("c{i}");
            let file = dir.join(format!("{name}.raw"));
            let f = std::fs::File::create(&file)
                .with_context(|| format!("Cannot create {}", file.display()))?;
            f.set_len(size)
                .with_context(|| format!("Cannot size {}", file.display()))?;
            drop(f);
            let port = free_port()?;
            let log_path = dir.join(format!("{name}.log"));
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("Cannot create {}", log_path.display()))?;
            // -t: keep serving after a client leaves (every fio run is a new client);
            // --shared: a run and the delay check may overlap; writeback like drove
            // (writes are volatile until a flush).
            let child = Command::new("qemu-nbd")
                .args([
                    "-f",
                    "raw",
                    "-x",
                    &name,
                    "-b",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                .args(["-t", "--shared=8", "--cache=writeback"])
                .arg(&file)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("Cannot start qemu-nbd")?;
            let mut g = ProcGuard::new(child, format!("qemu-nbd for {name}"));
            let server = format!("127.0.0.1:{port}");
            wait_port(&server, &mut g, Duration::from_secs(20), cancel)
                .with_context(|| format!("qemu-nbd did not start; see {}", log_path.display()))?;
            b.servers.push(g);
            let zone = client_zone(i, zones);
            let (uri, proxy) = if zone == 1 {
                (format!("nbd://{server}/{name}"), None)
            } else {
                let pname = proxy_name(i);
                let listen = toxi.create_proxy(&pname, &server)?;
                (format!("nbd://{listen}/{name}"), Some((pname, listen)))
            };
            b.clients.push(BaseClient {
                zone,
                uri,
                server,
                proxy,
            });
        }
        Ok(b)
    }

    /// The servers' pids.
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().map(ProcGuard::id).collect()
    }

    /// An error if a server died.
    pub fn check_running(&mut self) -> Result<()> {
        self.servers
            .iter_mut()
            .try_for_each(ProcGuard::check_running)
    }

    /// Stop every server now (also done on drop).
    pub fn stop(&mut self) {
        self.servers.iter_mut().for_each(ProcGuard::stop);
    }
}
