//! A cluster of real `drove` nodes, each in its own network namespace, for partition
//! tests. A "switch" namespace holds a bridge; every host namespace has a veth into
//! it and its own address in 10.77.X.0/24 (X from the test's pid). Nothing touches
//! the root namespace's networking: cutting a node off brings its veth down on the
//! bridge side, so its packets are dropped (TCP retransmits them after a heal, as on a
//! real network). Each node's NBD unix socket lives in its data dir, so clients in the
//! root namespace reach it through the filesystem.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{drove_bin, text};

/// Namespace names start with this, then the test's pid.
const PREFIX: &str = "drove-t";
const ADMIN_PORT: u16 = 7000;

/// One node of a [`NetCluster`].
#[derive(Debug, Clone)]
pub struct NetNode {
    /// Its network namespace.
    pub ns: String,
    /// Its address in the test network.
    pub ip: String,
    /// `ip:port` of its admin API (reachable only from the test namespaces).
    pub admin: String,
    /// Node id, from the cluster map.
    pub id: u64,
    pub data: PathBuf,
    /// stdout + stderr of `drove node run`.
    pub log: PathBuf,
    /// NBD unix socket (reachable from the root namespace).
    pub nbd_unix: String,
}

impl NetNode {
    /// NBD URI through the node's unix socket.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.nbd_unix)
    }
}

/// N nodes in N namespaces on one bridge; everything is removed on drop.
pub struct NetCluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<NetNode>,
    switch: String,
    children: Vec<Option<Child>>,
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip {args:?}: {e}"))
}

fn ip_ok(args: &[&str]) {
    let o = ip(args);
    assert!(o.status.success(), "ip {args:?} failed: {}", text(&o));
}

fn pid_alive(pid: u32) -> bool {
    super::exists(pid)
}

/// Kill every process left in namespace `ns`, then delete it (its veth ends go too).
fn remove_ns(ns: &str) {
    let o = ip(&["netns", "pids", ns]);
    for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
        if let Ok(p) = pid.parse::<u32>() {
            // Only processes inside this test's own namespace.
            super::signal(p, super::Signal::KILL);
        }
    }
    let _ = ip(&["netns", "del", ns]);
}

/// Namespaces of earlier runs of these tests whose process is gone (a crash or a
/// SIGKILL skipped Drop).
fn clean_leftovers() {
    let o = ip(&["netns", "list"]);
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !pid_alive(pid) {
            eprintln!("removing leftover namespace {name}");
            remove_ns(name);
        }
    }
}

/// Why partition tests cannot run here, if they cannot for want of root (the `ip`
/// tool they also need is checked with `require`, so that CI insists on it).
pub fn needs_root() -> Option<&'static str> {
    if !super::is_root() {
        return Some("network namespaces need root");
    }
    None
}

impl NetCluster {
    /// Start `n` nodes (node i in zone z{i+1}), node 0 first and the others joining
    /// it, each with `extra` arguments to `drove node run`; returns when every node's
    /// map has all `n` members.
    pub fn start(n: usize, extra: &[&str]) -> NetCluster {
        clean_leftovers();
        let pid = std::process::id();
        let x = pid % 250 + 1;
        let base = format!("{PREFIX}{pid}");
        let switch = format!("{base}-sw");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = NetCluster {
            dir,
            nodes: Vec::new(),
            switch: switch.clone(),
            children: Vec::new(),
        };
        ip_ok(&["netns", "add", &switch]);
        ip_ok(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        ip_ok(&["-n", &switch, "link", "set", "br0", "up"]);
        for i in 0..n {
            let ns = format!("{base}-{i}");
            let host_ip = format!("10.77.{x}.{}", i + 1);
            let veth = format!("h{i}");
            // Register the namespace before creating it, so Drop removes it even if a
            // later step fails.
            let data = c.dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&data).unwrap();
            c.nodes.push(NetNode {
                ns: ns.clone(),
                ip: host_ip.clone(),
                admin: format!("{host_ip}:{ADMIN_PORT}"),
                id: 0,
                log: data.join("node.log"),
                nbd_unix: data.join("nbd.sock").display().to_string(),
                data,
            });
            ip_ok(&["netns", "add", &ns]);
            ip_ok(&[
                "-n", &switch, "link", "add", &veth, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ]);
            ip_ok(&["-n", &switch, "link", "set", &veth, "master", "br0"]);
            ip_ok(&["-n", &switch, "link", "set", &veth, "up"]);
            ip_ok(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{host_ip}/24"),
                "dev",
                "eth0",
            ]);
            ip_ok(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip_ok(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        for i in 0..n {
            let child = c.spawn(i, i > 0, extra);
            c.children.push(Some(child));
            c.wait_members(i, i + 1);
        }
        for i in 0..n {
            c.wait_members(i, n);
        }
        // Joiners come in as learners; the leader promotes them once caught up (3
        // voters at most by default, never 2).
        c.wait_voters(if n >= 3 { 3 } else { 1 });
        // The nodes' data shares the test machine's disk: as in `Cluster`, recovery
        // must not wait for room a test does not need.
        let o = c.drove(0, &["cluster", "config", "--backfill-full", "100"]);
        assert!(o.status.success(), "cluster config failed: {}", text(&o));
        c
    }

    /// Wait (up to 60 s) until node 0's `node list` shows `want` metadata voters.
    fn wait_voters(&self, want: usize) {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let o = self.drove(0, &["node", "list", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            let voters: usize = v["voter_zones"]
                .as_object()
                .map(|z| {
                    z.values()
                        .filter_map(|ids| ids.as_array())
                        .map(Vec::len)
                        .sum()
                })
                .unwrap_or(0);
            if voters == want {
                return;
            }
            assert!(
                Instant::now() < end,
                "{voters} metadata voters after 60 s, not {want}: {v}\n{}",
                self.log_tail(0, 40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn spawn(&self, i: usize, join: bool, extra: &[&str]) -> Child {
        let n = &self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &n.ns, drove_bin(), "node", "run"])
            .args(["--data", n.data.to_str().unwrap()])
            .args(["--listen", &n.admin, "--zone", &format!("z{}", i + 1)]);
        if join {
            cmd.args(["--join", &self.nodes[0].admin]);
        }
        // `ip netns exec` execs the command itself, so the child's pid is the node's.
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("ip netns exec drove node run")
    }

    /// Wait until node `i` answers and its map has `want` nodes; records node ids.
    fn wait_members(&mut self, i: usize, want: usize) {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(Some(c)) = self.children.get_mut(i) {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!(
                        "node {i} exited ({st}) while starting:\n{}",
                        self.log_tail(i, 40)
                    );
                }
            }
            let o = self.drove(i, &["node", "list", "--json"]);
            if o.status.success() {
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
                if let Some(map) = v["nodes"].as_object() {
                    for info in map.values() {
                        let addr = info["admin_addr"].as_str().unwrap_or("");
                        if let Some(n) = self.nodes.iter_mut().find(|n| n.admin == addr) {
                            n.id = info["id"].as_u64().unwrap_or(0);
                        }
                    }
                    if map.len() >= want && Path::new(&self.nodes[i].nbd_unix).exists() {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < end,
                "node {i} did not see {want} members in 60 s:\n{}",
                self.log_tail(i, 40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Run `drove ARGS --cluster <node i>` inside node i's namespace.
    pub fn drove(&self, i: usize, args: &[&str]) -> Output {
        let n = &self.nodes[i];
        Command::new("ip")
            .args(["netns", "exec", &n.ns, drove_bin()])
            .args(args)
            .args(["--cluster", &n.admin])
            .output()
            .expect("ip netns exec drove")
    }

    /// Cut node `i` off the network (its bridge port goes down).
    pub fn cut(&self, i: usize) {
        ip_ok(&["-n", &self.switch, "link", "set", &format!("h{i}"), "down"]);
    }

    /// Connect node `i` again.
    pub fn heal(&self, i: usize) {
        ip_ok(&["-n", &self.switch, "link", "set", &format!("h{i}"), "up"]);
    }

    /// Cut node `i` off without its link going down: its bridge port stops
    /// forwarding. [`NetCluster::cut`] takes the carrier away, and the kernel may
    /// take up to a second after [`NetCluster::heal`] to send on the link again
    /// (link events are batched); a switch that stops forwarding changes no carrier.
    pub fn block(&self, i: usize) {
        self.port_state(i, "0");
    }

    /// Let node `i`'s bridge port forward again after [`NetCluster::block`].
    pub fn unblock(&self, i: usize) {
        self.port_state(i, "3");
    }

    fn port_state(&self, i: usize, state: &str) {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.switch, "bridge", "link", "set"])
            .args(["dev", &format!("h{i}"), "state", state])
            .output()
            .expect("bridge");
        assert!(
            o.status.success(),
            "bridge link set h{i} state {state}: {}",
            text(&o)
        );
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last `lines` lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let t = std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default();
        let all: Vec<&str> = t.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Print every node's log tail (for a failed test).
    pub fn dump_logs(&self, lines: usize) {
        for (i, n) in self.nodes.iter().enumerate() {
            eprintln!(
                "----- node {i} (id {}, {}) log {} -----\n{}",
                n.id,
                n.admin,
                n.log.display(),
                self.log_tail(i, lines)
            );
        }
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs(60);
        }
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.nodes {
            remove_ns(&n.ns);
        }
        remove_ns(&self.switch);
        // Keep the data dirs (node logs) of a failed run, or when asked to.
        if std::thread::panicking() || std::env::var_os("DROVE_KEEP_LOGS").is_some() {
            let kept = self.dir.path().to_path_buf();
            eprintln!("node logs kept in {}", kept.display());
            // Leak the TempDir on purpose so the directory stays.
            let d = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
            let _ = d.keep();
        }
    }
}
