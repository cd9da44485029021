//! The drove side of the experiment: a local cluster started with the `drove`
//! binary (`drove up --detach`), stopped with `drove down` when dropped. Its
//! layout comes from DIR/cluster.json. Each node's DATA/peer-routes.json sends its
//! dials to other zones through the WAN proxies; nodes read it at every peer dial
//! and dial lazily on first I/O, so it is written before any disk is used.
//!
//! Every `drove` this runs ([`drove`]) speaks to this cluster with this cluster's
//! credentials (none: plain HTTP, no token), whatever the user's environment holds
//! for another cluster (`DROVE_CA`, `DROVE_TOKEN_FILE`, as `drove up` tells users
//! to export).
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::http;
use crate::metrics::{node_counters, NodeCounters};
use crate::procs::run_checked;
use crate::wan;

use drove_types::local_cluster::ClusterFile;
pub use drove_types::local_cluster::NodeEntry;

/// The variables the CLI takes its cluster and credentials from, cleared for the
/// bench's own cluster: it names its nodes with `--cluster` and has no CA or token.
const CLUSTER_ENV: [&str; 4] = [
    "DROVE_CLUSTER",
    "DROVE_CA",
    "DROVE_TOKEN",
    "DROVE_TOKEN_FILE",
];

/// `bin` (the drove binary) as a command for this cluster: none of the user's
/// cluster variables.
fn drove(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    for var in CLUSTER_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// A running local cluster, stopped when dropped.
#[derive(Debug)]
pub struct DroveCluster {
    bin: PathBuf,
    dir: PathBuf,
    /// The nodes, in cluster.json order.
    pub nodes: Vec<NodeEntry>,
    stopped: bool,
}

impl DroveCluster {
    /// `drove up` with `zones x per_zone` nodes in `dir`, default copies `copies`.
    pub fn start(
        bin: &Path,
        dir: &Path,
        zones: usize,
        per_zone: usize,
        copies: u8,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("Cannot create {}", dir.display()))?;
        let n = zones * per_zone;
        // The guard exists before `up` runs, so a failure after `up` wrote
        // cluster.json still stops the nodes (`down` reads the same DIR).
        let mut c = DroveCluster {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            nodes: Vec::new(),
            stopped: false,
        };
        let mut cmd = drove(bin);
        // Plain HTTP and NBD: the bench talks to the nodes and qemu-nbd alike.
        cmd.args([
            "up",
            "--detach",
            "--base-port",
            "0",
            "--no-tls",
            "--no-auth",
        ])
        .args(["--nodes", &n.to_string(), "--zones", &zones.to_string()])
        .args(["--copies", &copies.to_string()])
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null());
        run_checked(&mut cmd, "drove up")?;
        let path = dir.join("cluster.json");
        let bytes =
            std::fs::read(&path).with_context(|| format!("Cannot read {}", path.display()))?;
        let f: ClusterFile = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not a cluster file", path.display()))?;
        if f.nodes.len() != n {
            bail!("drove up started {} nodes, not {n}", f.nodes.len());
        }
        c.nodes = f.nodes;
        Ok(c)
    }

    /// `(id, zone)` of every node, in order.
    pub fn id_zones(&self) -> Vec<(u64, String)> {
        self.nodes.iter().map(|n| (n.id, n.zone.clone())).collect()
    }

    /// Zone of every node, in order.
    pub fn zones(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.zone.clone()).collect()
    }

    /// Write node `i`'s routes file.
    pub fn write_routes(&self, i: usize, routes: &BTreeMap<String, String>) -> Result<()> {
        let n = self.nodes.get(i).ok_or_else(|| anyhow!("No node {i}"))?;
        let path = Path::new(&n.data).join("peer-routes.json");
        let text = wan::routes_json(routes)?;
        // Write then rename: a node dialling at this moment never reads half a file.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).with_context(|| format!("Cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("Cannot write {}", path.display()))
    }

    /// Create VDI `name` of `size` bytes with `copies` copies and write `policy`.
    pub fn create_vdi(
        &self,
        name: &str,
        size: u64,
        copies: u8,
        policy: drove_types::WritePolicy,
    ) -> Result<()> {
        let admin = &self
            .nodes
            .first()
            .ok_or_else(|| anyhow!("Empty cluster"))?
            .admin;
        let mut cmd = drove(&self.bin);
        cmd.args(["vdi", "create", name, &size.to_string()])
            .args(["--copies", &copies.to_string(), "--cluster", admin])
            .args(["--policy", &policy.to_string()])
            .stdin(Stdio::null());
        run_checked(&mut cmd, &format!("drove vdi create {name}"))?;
        Ok(())
    }

    /// Mark nodes down after `secs` without heartbeats (`drove cluster config
    /// --down-after`).
    pub fn set_down_after(&self, secs: f64) -> Result<()> {
        let admin = &self
            .nodes
            .first()
            .ok_or_else(|| anyhow!("Empty cluster"))?
            .admin;
        let mut cmd = drove(&self.bin);
        cmd.args(["cluster", "config", "--down-after", &secs.to_string()])
            .args(["--cluster", admin])
            .stdin(Stdio::null());
        run_checked(&mut cmd, "drove cluster config --down-after")?;
        Ok(())
    }

    /// The NBD URI of VDI `name` on node `i`'s unix socket.
    pub fn unix_uri(&self, i: usize, name: &str) -> Result<String> {
        let n = self.nodes.get(i).ok_or_else(|| anyhow!("No node {i}"))?;
        Ok(format!("nbd+unix:///{name}?socket={}", n.nbd_unix))
    }

    /// Every node's counters, in order.
    pub fn scrape(&self) -> Result<Vec<NodeCounters>> {
        self.nodes
            .iter()
            .map(|n| {
                let text = http::get_ok(&n.admin, "/metrics", Duration::from_secs(10))
                    .with_context(|| format!("Reading the metrics of node {}", n.id))?;
                Ok(node_counters(&text))
            })
            .collect()
    }

    /// `drove down` now (also done on drop).
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if !self.dir.join("cluster.json").exists() {
            return;
        }
        let r = drove(&self.bin)
            .args(["down", "--dir"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(r, Ok(s) if s.success()) {
            say!(
                "warning: `drove down --dir {}` failed; nodes may still run",
                self.dir.display()
            );
        }
    }
}

impl Drop for DroveCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
