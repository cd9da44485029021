//! Test kit for end-to-end tests: real `drove` node processes on 127.0.0.1 (started
//! with `drove up --detach`, one temp dir and free ports each), real clients
//! (qemu-io, qemu-img, nbdinfo, fio), and waits that poll a condition with a
//! deadline instead of sleeping. A missing client binary fails the test under CI and
//! makes it print "SKIPPED: ..." and return elsewhere ([`require`]); it never passes
//! silently.
#![allow(dead_code)]

pub mod fua;
pub mod guest_loop;
pub mod netns;
pub mod outage;
pub mod vm;

pub use rustix::process::Signal;

#[allow(unused_imports)] // each test binary uses its own part of the kit
pub use drove_testkit::{in_ci, on_path, require, require_ok, skip, unmet, wait_for, wait_until};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

pub fn drove_bin() -> &'static str {
    env!("CARGO_BIN_EXE_drove")
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A free port below the ephemeral range, so no outgoing connection takes it
/// before the node binds it.
pub fn free_port() -> u16 {
    use std::hash::BuildHasher;
    (0u32..1000)
        .map(|i| {
            let r =
                std::collections::hash_map::RandomState::new().hash_one((i, std::process::id()));
            20000 + (r % 12000) as u16
        })
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port")
}

/// One node as cluster.json describes it.
pub use drove_types::local_cluster::NodeEntry as Node;

/// NBD URIs of a node.
pub trait NodeUris {
    /// Through the node's unix socket.
    fn uri(&self, export: &str) -> String;
    /// Through the node's TCP listener.
    fn tcp_uri(&self, export: &str) -> String;
}

impl NodeUris for Node {
    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.nbd_unix)
    }
    fn tcp_uri(&self, export: &str) -> String {
        format!("{}/{export}", self.nbd_tcp)
    }
}

/// A local cluster, stopped (SIGKILL of anything left) when dropped.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
    /// The certificates of a cluster started with `drove up --tls`.
    pub tls: Option<drove_types::local_cluster::ClusterTls>,
    /// Nodes restarted by the test (not by `drove up`).
    extra: Vec<Child>,
}

impl Cluster {
    pub fn start(nodes: usize, zones: usize) -> Cluster {
        Self::start_in(tempfile::tempdir().expect("tempdir"), nodes, zones)
    }

    /// Like [`Cluster::start`] in a directory the test prepared (node i's data is
    /// `dir/node<i+1>`, e.g. with a small filesystem mounted on its `store`).
    pub fn start_in(dir: tempfile::TempDir, nodes: usize, zones: usize) -> Cluster {
        Self::start_with(dir, nodes, zones, &[])
    }

    /// [`Cluster::start_in`] with more `drove up` arguments (`--tls`).
    pub fn start_with(
        dir: tempfile::TempDir,
        nodes: usize,
        zones: usize,
        extra: &[&str],
    ) -> Cluster {
        Self::start_cmd(dir, nodes, zones, extra, |_| {})
    }

    /// [`Cluster::start_with`], with `prepare` given the `drove up` command before
    /// it runs (to set its umask, say; the nodes inherit it).
    pub fn start_cmd(
        dir: tempfile::TempDir,
        nodes: usize,
        zones: usize,
        extra: &[&str],
        prepare: impl FnOnce(&mut Command),
    ) -> Cluster {
        // `drove up` makes certificates and a token by default; a test asks for
        // what it tests (`--tls`, `--auth`) and gets plain HTTP and NBD otherwise.
        let mut plain = Vec::new();
        if !extra.contains(&"--tls") {
            plain.push("--no-tls");
        }
        if !extra.contains(&"--auth") {
            plain.push("--no-auth");
        }
        let mut up = Command::new(drove_bin());
        up.arg("up").args(extra).args(&plain).args([
            "--nodes",
            &nodes.to_string(),
            "--zones",
            &zones.to_string(),
            "--dir",
            dir.path().to_str().unwrap(),
            "--detach",
            "--base-port",
            "0",
        ]);
        prepare(&mut up);
        let o = run(&mut up);
        assert!(o.status.success(), "drove up failed: {}", text(&o));
        let c = Cluster::adopt_dir(dir);
        // Every node of a test cluster keeps its data on the one disk of the
        // machine running the tests, shared with the build and other tests. Past
        // the default 90 %, recovery would wait for room that a test's few MiB do
        // not need, and tests that wait for recovery would fail on a full build
        // machine (CI did, at 91.7 %). Tests of the limit set their own.
        let o = c.drove(0, &["cluster", "config", "--backfill-full", "100"]);
        assert!(o.status.success(), "cluster config failed: {}", text(&o));
        c
    }

    /// The cluster another `drove up` (another build's, say) started in `dir`.
    pub fn adopt_dir(dir: tempfile::TempDir) -> Cluster {
        let mut c = Cluster {
            dir,
            nodes: Vec::new(),
            tls: None,
            extra: Vec::new(),
        };
        c.reload();
        c
    }

    /// Stop node `i` as systemd would (SIGTERM) and wait until it has exited.
    pub fn stop(&mut self, i: usize) {
        let pid = self.nodes[i].pid;
        signal(pid, Signal::TERM);
        wait_until(Duration::from_secs(60), "stopped node to exit", || {
            reap(pid);
            !exists(pid)
        });
    }

    pub fn reload(&mut self) {
        let bytes = std::fs::read(self.dir.path().join("cluster.json")).unwrap();
        let f: drove_types::local_cluster::ClusterFile = serde_json::from_slice(&bytes).unwrap();
        self.nodes = f.nodes;
        self.tls = f.tls;
    }

    /// Run `drove ARGS --cluster <node i>`, with the admin token of a cluster
    /// started with `drove up --auth`.
    pub fn drove(&self, i: usize, args: &[&str]) -> Output {
        let mut cmd = Command::new(drove_bin());
        cmd.args(args).args(["--cluster", &self.nodes[i].admin]);
        if let Some(t) = &self.nodes[i].admin_token_file {
            cmd.env("DROVE_TOKEN_FILE", t);
        }
        // With certificates the admin API speaks HTTPS only.
        if let Some(t) = &self.tls {
            cmd.env("DROVE_CA", &t.dir);
        }
        run(&mut cmd)
    }

    /// `drove cluster status --json`, asked of node 1.
    pub fn status(&self) -> serde_json::Value {
        let o = self.drove(0, &["cluster", "status", "--json"]);
        assert!(o.status.success(), "cluster status failed: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// The names in `drove vdi list`.
    pub fn vdi_names(&self) -> Vec<String> {
        let o = self.drove(0, &["vdi", "list", "--json"]);
        assert!(o.status.success(), "vdi list failed: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// `drove vdi create` that must succeed.
    pub fn create_vdi(&self, name: &str, size: &str, extra: &[&str]) {
        let mut args = vec!["vdi", "create", name, size];
        args.extend_from_slice(extra);
        let o = self.drove(0, &args);
        assert!(o.status.success(), "vdi create failed: {}", text(&o));
    }

    pub fn kill(&self, i: usize) {
        let pid = self.nodes[i].pid;
        signal(pid, Signal::KILL);
        wait_until(Duration::from_secs(10), "killed node to exit", || {
            reap(pid);
            !exists(pid)
        });
    }

    /// Start node `i` again on the same data directory and ports.
    pub fn restart(&mut self, i: usize) {
        self.restart_with(i, &[]);
    }

    /// [`Cluster::restart`] with more `drove node run` arguments.
    pub fn restart_with(&mut self, i: usize, extra: &[&str]) {
        self.restart_env(i, extra, &[]);
    }

    /// [`Cluster::restart_with`], the node's environment given `env` too.
    pub fn restart_env(&mut self, i: usize, extra: &[&str], env: &[(&str, &str)]) {
        let n = self.nodes[i].clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(Path::new(&n.data).join("node.log"))
            .unwrap();
        // As `drove up` started it: its certificates and token file too.
        let mut kept = Vec::new();
        if let Some(t) = &n.tls_dir {
            kept.extend(["--tls-dir".to_string(), t.clone()]);
        }
        if let Some(t) = &n.admin_token_file {
            kept.extend(["--admin-token-file".to_string(), t.clone()]);
        }
        let child = Command::new(drove_bin())
            .args(["node", "run", "--data", &n.data])
            .args([
                "--zone",
                &n.zone,
                "--listen",
                &n.admin,
                "--peer-listen",
                &n.peer,
            ])
            .args(["--nbd-listen", n.nbd_tcp.trim_start_matches("nbd://")])
            .args(&kept)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes[i].pid = child.id();
        self.extra.push(child);
        wait_until(Duration::from_secs(60), "restarted node to serve", || {
            self.drove(i, &["cluster", "status"]).status.success()
                && Path::new(&n.nbd_unix).exists()
        });
    }

    /// Take `child`, a process a test started as node `i`, into the cluster's
    /// care: it is node `i`'s process from now on, and killed with the cluster.
    pub fn adopt(&mut self, i: usize, child: std::process::Child) {
        self.nodes[i].pid = child.id();
        self.extra.push(child);
    }

    /// `drove down`, then `drove up` on the same directory.
    pub fn restart_all(&mut self) {
        let o = run(Command::new(drove_bin()).args([
            "down",
            "--dir",
            self.dir.path().to_str().unwrap(),
        ]));
        assert!(o.status.success(), "drove down failed: {}", text(&o));
        for c in &mut self.extra {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.extra.clear();
        let o = run(Command::new(drove_bin()).args([
            "up",
            "--dir",
            self.dir.path().to_str().unwrap(),
            "--detach",
        ]));
        assert!(
            o.status.success(),
            "drove up (restart) failed: {}",
            text(&o)
        );
        self.reload();
    }

    pub fn metrics(&self, i: usize) -> String {
        let mut cmd = Command::new("curl");
        match &self.tls {
            // HTTPS only; node certificates of `drove up --tls` name 127.0.0.1.
            Some(t) => cmd.args([
                "-sf",
                "--cacert",
                &t.ca_cert,
                &format!("https://{}/metrics", self.nodes[i].admin),
            ]),
            None => cmd.args(["-sf", &format!("http://{}/metrics", self.nodes[i].admin)]),
        };
        let o = run(&mut cmd);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A failing test (on CI, say) shows what each node logged last: the
        // directory is gone after this.
        if std::thread::panicking() {
            for n in &self.nodes {
                let log = Path::new(&n.data).join("node.log");
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(80)..];
                eprintln!(
                    "--- last {} lines of node {} ({}):\n{}",
                    tail.len(),
                    n.id,
                    log.display(),
                    tail.join("\n")
                );
            }
        }
        let _ = Command::new(drove_bin())
            .args(["down", "--dir", self.dir.path().to_str().unwrap()])
            .output();
        for c in &mut self.extra {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.nodes {
            signal(n.pid, Signal::KILL);
        }
    }
}

/// The first `len` bytes of the disk at `uri`, read with `qemu-img convert` into a
/// raw file in `dir`; panics when qemu-img fails.
pub fn read_image(uri: &str, dir: &Path, len: usize) -> Vec<u8> {
    let raw = dir.join("disk.raw");
    let o = run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", uri])
        .arg(&raw));
    assert!(o.status.success(), "qemu-img convert {uri}: {}", text(&o));
    let mut bytes = std::fs::read(&raw).unwrap();
    bytes.truncate(len);
    bytes
}

/// fio through NBD `uri` as job `name`: 4 KiB random writes at queue depth `qd`,
/// each followed by a FLUSH, paced at 500 a second over 12 MiB of a 64 MiB VDI
/// (about 6 s), every block checked afterwards (crc32c); JSON on stdout. Callers
/// add their own options, then spawn it.
pub fn paced_fio(name: &str, uri: &str, qd: usize) -> Command {
    let mut c = Command::new("fio");
    c.args([
        &format!("--name={name}"),
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        &format!("--iodepth={qd}"),
        "--fsync=1",
        "--size=64M",
        "--io_size=12M",
        "--rate_iops=500",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--output-format=json",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// fio's outcome: it must have succeeded with no error and read back what it wrote.
pub fn fio_ok(load: Child, what: &str) -> serde_json::Value {
    let o = load.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let j: serde_json::Value = out
        .find('{')
        .and_then(|i| serde_json::from_str(&out[i..]).ok())
        .unwrap_or_default();
    assert!(o.status.success(), "fio ({what}) failed: {}", text(&o));
    assert_eq!(j["jobs"][0]["error"].as_i64(), Some(0), "fio ({what}): {j}");
    j
}

/// Run qemu-io with `cmds` on `uri`; panics on a failed command or a pattern mismatch.
pub fn qemu_io(uri: &str, cmds: &[String]) -> String {
    try_qemu_io(uri, cmds).unwrap_or_else(|e| panic!("{e}"))
}

/// Run qemu-io with `cmds` on `uri`: its output, or why it failed (a failed command or
/// a pattern mismatch), for a caller that retries.
pub fn try_qemu_io(uri: &str, cmds: &[String]) -> Result<String, String> {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(uri);
    let o = run(&mut c);
    let t = text(&o);
    if !o.status.success() {
        return Err(format!("qemu-io failed on {uri}: {t}"));
    }
    if t.contains("Pattern verification failed") || t.contains("error") || t.contains("failed") {
        return Err(format!("qemu-io on {uri}: {t}"));
    }
    Ok(t)
}

/// `pid` as a process id (`None` for 0 and numbers past `i32`, which `kill` would
/// take as a group or every process).
fn to_pid(pid: u32) -> Option<rustix::process::Pid> {
    rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)
}

/// Send `sig` to process `pid`.
pub fn signal(pid: u32, sig: Signal) {
    if let Some(p) = to_pid(pid) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// Whether process `pid` exists (a zombie still does).
pub fn exists(pid: u32) -> bool {
    to_pid(pid).is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// Collect child `pid` if it has exited (not waiting for it).
pub fn reap(pid: u32) {
    if let Some(p) = to_pid(pid) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
    }
}

/// Whether this test runs as root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Runs `drove down --dir DIR` when dropped: for a cluster a test started with
/// `drove up` itself.
pub struct DownOnDrop(pub std::path::PathBuf);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = Command::new(drove_bin())
            .args(["down", "--dir"])
            .arg(&self.0)
            .output();
    }
}

/// Object data files (checksum files aside) under node data directory `data`.
pub fn object_files(data: &Path) -> usize {
    fn walk(p: &Path, n: &mut usize) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, n);
                } else if !path.to_string_lossy().ends_with(".crc") {
                    *n += 1;
                }
            }
        }
    }
    let mut n = 0;
    walk(&data.join("store").join("objects"), &mut n);
    n
}

/// The findings of a `cluster health --json` answer that are not OK, as messages,
/// leaving out disk warnings: the nodes of a test share the disk of the machine the
/// tests run on, and a nearly full CI disk (88 % used in one CI run) is not what a
/// test checks. A disk at ERR is kept, and so is every other check.
pub fn findings_but_disk_warnings(h: &serde_json::Value) -> Vec<String> {
    h["checks"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|c| c["level"] != "ok" && !(c["check"] == "disk" && c["level"] == "warn"))
        .map(|c| c.to_string())
        .collect()
}
