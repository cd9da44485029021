//! The `drove` command as a shell uses it: output into a pipe the reader closed
//! early, the forms of `--cluster` / `DROVE_CLUSTER`, and what an unreachable
//! cluster's error says.
mod common;
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

/// The write end of a pipe whose read end is already closed, as after
/// `drove … | head -1` once head has exited: every write to it fails (EPIPE).
fn closed_pipe() -> Stdio {
    let (read, write) = rustix::pipe::pipe().expect("pipe()");
    drop(read);
    Stdio::from(write)
}

/// Whether process `pid` ignores SIGPIPE (the SigIgn mask of /proc/PID/status).
fn ignores_sigpipe(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .expect("SigIgn line");
    let mask = u64::from_str_radix(mask.trim(), 16).unwrap();
    mask & (1 << (Signal::PIPE.as_raw() - 1)) != 0
}

#[test]
fn test_printing_into_a_closed_pipe_does_not_panic() {
    let c = Cluster::start(1, 1);
    c.create_vdi("v", "1M", &["--copies", "1"]);
    let admin = &c.nodes[0].admin;
    for args in [
        &["cluster", "status"][..],
        &["cluster", "status", "--json"],
        &["node", "list"],
        &["vdi", "list"],
        &["vdi", "info", "v"],
    ] {
        let o = Command::new(drove_bin())
            .args(args)
            .args(["--cluster", admin])
            .stdout(closed_pipe())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "drove {args:?} into a closed pipe: {err}"
        );
        assert_ne!(o.status.code(), Some(101), "drove {args:?}: {err}");
        // Ended by SIGPIPE like any Unix filter (or done before its first write).
        assert!(
            o.status.signal() == Some(Signal::PIPE.as_raw()) || o.status.success(),
            "drove {args:?} ended with {:?}: {err}",
            o.status
        );
    }
    // The daemon still ignores SIGPIPE: a peer closing a socket must never kill it.
    assert!(
        ignores_sigpipe(c.nodes[0].pid),
        "node run must ignore SIGPIPE"
    );
}

#[test]
fn test_cluster_given_as_an_http_url_or_with_a_trailing_slash_works() {
    let c = Cluster::start(1, 1);
    let admin = &c.nodes[0].admin;
    for given in [format!("http://{admin}"), format!("http://{admin}/")] {
        let o = run(Command::new(drove_bin()).args(["cluster", "status", "--cluster", &given]));
        assert!(o.status.success(), "--cluster {given}: {}", text(&o));
        let o = run(Command::new(drove_bin())
            .args(["node", "list"])
            .env("DROVE_CLUSTER", &given));
        assert!(o.status.success(), "DROVE_CLUSTER={given}: {}", text(&o));
    }
}

/// A command that fails with `needle` in its message, cleanly (exit 1, no panic).
fn fails_with(o: &std::process::Output, needle: &str) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(1), "expected exit 1: {t}");
    assert!(t.contains(needle), "expected '{needle}' in: {t}");
    assert!(!t.contains("panicked"), "panic: {t}");
}

#[test]
fn test_unreachable_cluster_error_names_the_address_tried_and_its_source() {
    // Port 1 on loopback: nothing listens there (a privileged port no test uses).
    let o = run(Command::new(drove_bin())
        .args(["vdi", "list", "--cluster", "http://127.0.0.1:1/"])
        .env_remove("DROVE_CLUSTER"));
    fails_with(
        &o,
        "Cannot reach the cluster at 127.0.0.1:1 (from --cluster http://127.0.0.1:1/)",
    );
    let o = run(Command::new(drove_bin())
        .args(["vdi", "list"])
        .env("DROVE_CLUSTER", "127.0.0.1:1"));
    fails_with(
        &o,
        "Cannot reach the cluster at 127.0.0.1:1 (from DROVE_CLUSTER=127.0.0.1:1)",
    );
    // The flag wins over the variable, and says so.
    let o = run(Command::new(drove_bin())
        .args(["cluster", "status", "--cluster", "[::1]:1"])
        .env("DROVE_CLUSTER", "127.0.0.1:7000"));
    fails_with(
        &o,
        "Cannot reach the cluster at [::1]:1 (from --cluster [::1]:1)",
    );
    // Not an admin address at all: refused before anything is sent.
    let o = run(Command::new(drove_bin())
        .args(["vdi", "list"])
        .env("DROVE_CLUSTER", "nbd://127.0.0.1:7000"));
    fails_with(&o, "Bad DROVE_CLUSTER 'nbd://127.0.0.1:7000': scheme 'nbd'");
    // https without the cluster's CA: refused before anything is sent, saying why.
    let o = run(Command::new(drove_bin())
        .args(["vdi", "list"])
        .env("DROVE_CLUSTER", "https://127.0.0.1:1")
        .env_remove("DROVE_CA"));
    fails_with(
        &o,
        "https://127.0.0.1:1 asks for https: give the cluster's CA",
    );
    let o = run(Command::new(drove_bin()).args(["vdi", "list", "--cluster", "127.0.0.1:7000/api"]));
    fails_with(&o, "Bad --cluster '127.0.0.1:7000/api': '/api' is a path");
}

#[test]
fn test_drove_up_nodes_write_a_rotated_log_file_and_keep_stderr_apart() {
    let c = Cluster::start(1, 1);
    let n = &c.nodes[0];
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", n.pid)).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let log = std::path::Path::new(&n.data).join("node.log");
    let at = args.iter().position(|a| a == "--log-file");
    assert_eq!(
        at.map(|i| args[i + 1].as_str()),
        log.to_str(),
        "node run args: {args:?}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("node ready"), "node.log:\n{text}");
    // stdout and stderr have a file of their own (for panics and early errors).
    let stderr = std::path::Path::new(&n.data).join("node.stderr");
    assert!(stderr.is_file(), "no {}", stderr.display());
}

/// `drove up` prints an nbdinfo command for the TLS-only NBD port; run as printed
/// (VDI replaced by a VDI's name), it works with Debian 12's nbdinfo (libnbd 1.14,
/// which has no --tls-certificates option: the certificates go in the nbds:// URI).
/// The node table shows that port as `nbds://`, as `vdi info` does.
#[test]
fn test_drove_up_prints_an_nbdinfo_command_that_works() {
    if !require(&["nbdinfo", "sh"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let down = DownOnDrop(dir.path().to_path_buf());
    let o = run(Command::new(drove_bin())
        .args([
            "up",
            "--nodes",
            "1",
            "--detach",
            "--base-port",
            "0",
            "--dir",
        ])
        .arg(&down.0)
        .env_remove("DROVE_CA")
        .env_remove("DROVE_TOKEN_FILE")
        .env_remove("DROVE_TOKEN"));
    assert!(o.status.success(), "{}", text(&o));
    let printed = String::from_utf8_lossy(&o.stdout).into_owned();
    let export = |var: &str| {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {var}=")))
            .unwrap_or_else(|| panic!("drove up printed no {var}: {printed}"))
            .to_string()
    };
    let o = run(Command::new(drove_bin())
        .args(["vdi", "create", "vm1", "8M", "--json"])
        .env("DROVE_CLUSTER", export("DROVE_CLUSTER"))
        .env("DROVE_CA", export("DROVE_CA"))
        .env("DROVE_TOKEN_FILE", export("DROVE_TOKEN_FILE")));
    assert!(o.status.success(), "{}", text(&o));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tcp = info["nbd_tcp"].as_str().unwrap();
    assert!(tcp.starts_with("nbds://"), "{info}");
    let port = tcp.rsplit(':').next().unwrap().split('/').next().unwrap();
    let table = printed
        .lines()
        .find(|l| l.contains(&format!("127.0.0.1:{port}")))
        .unwrap_or_else(|| panic!("no node row with port {port}: {printed}"));
    assert!(
        table.contains(&format!("nbds://127.0.0.1:{port}")),
        "{table}"
    );
    let cmd = printed
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("nbdinfo "))
        .unwrap_or_else(|| panic!("no nbdinfo command: {printed}"))
        .replace("/VDI", "/vm1");
    let o = run(Command::new("sh").args(["-c", &cmd]));
    assert!(o.status.success(), "`{cmd}` failed: {}", text(&o));
    assert!(text(&o).contains("8388608"), "`{cmd}`: {}", text(&o));
}

/// `drove up` on a cluster whose nodes partly run starts the dead ones on their
/// data and ports and leaves the others be; it once refused ("still running; stop
/// it with drove down"), so a killed node could not come back without stopping all.
#[test]
fn test_drove_up_starts_the_dead_nodes_of_a_running_cluster() {
    if !require(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(3, 3);
    c.create_vdi("keep", "16M", &["--copies", "3"]);
    qemu_io(
        &c.nodes[0].uri("keep"),
        &["write -P 0x6d 0 4M".into(), "flush".into()],
    );
    let before = c.nodes.clone();
    c.kill(1);
    let o = run(Command::new(drove_bin())
        .args(["up", "--detach", "--dir"])
        .arg(c.dir.path()));
    assert!(o.status.success(), "{}", text(&o));
    c.reload();
    for (i, (was, now)) in before.iter().zip(&c.nodes).enumerate() {
        assert_eq!(
            (&was.admin, &was.nbd_tcp),
            (&now.admin, &now.nbd_tcp),
            "node {i}"
        );
        if i == 1 {
            assert_ne!(was.pid, now.pid, "node 2 was not started again");
            assert!(exists(now.pid), "node 2 is not running");
        } else {
            assert_eq!(was.pid, now.pid, "node {i} was restarted");
        }
    }
    let s = c.status();
    let nodes = s["map"]["nodes"].as_object().unwrap();
    assert_eq!(nodes.len(), 3, "{s}");
    wait_until(
        std::time::Duration::from_secs(30),
        "node 2 to be up",
        || {
            let s = c.status();
            s["map"]["nodes"]
                .as_object()
                .unwrap()
                .values()
                .all(|n| n["state"] == "up")
        },
    );
    qemu_io(&c.nodes[1].uri("keep"), &["read -P 0x6d 0 4M".into()]);
}
