//! `drove node run --join ADDR` when ADDR is wrong: nothing listens there (the node
//! says every few seconds what it tried and why it failed, then gives up with an
//! error and a non-zero exit at --join-timeout), or something answers that is not
//! a drove node's admin API (it fails at once).
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run `drove node run` on a fresh directory joining `join`, with `extra` flags;
/// killed (and the test failed) if it has not exited after `limit`. Returns its
/// output and how long it ran.
fn node_run_joining(join: &str, extra: &[&str], limit: Duration) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node");
    let started = Instant::now();
    let mut child = Command::new(drove_bin())
        .args(["node", "run", "--data", data.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--join", join])
        .args(extra)
        // The default filter (info) is what an operator sees.
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "drove node run --join {join} still running after {limit:?}:\n{}",
                text(&o)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    (child.wait_with_output().unwrap(), took)
}

/// A TCP port on 127.0.0.1 where nothing listens (bound, then released).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn test_join_where_nothing_listens_retries_visibly_then_fails() {
    let join = format!("127.0.0.1:{}", closed_port());
    let (o, took) = node_run_joining(&join, &["--join-timeout", "6"], Duration::from_secs(40));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "exit status {:?}:\n{err}",
        o.status
    );
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(30),
        "gave up after {took:?}, --join-timeout was 6 s:\n{err}"
    );
    // What it tried, why it failed, how long it keeps trying; at warn level, more
    // than once (the first failure, then every few seconds).
    let what = format!("Cannot learn the cluster id from {join}");
    let retries: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains(&what))
        .filter(|l| l.contains("Connection refused") && l.contains("retrying, giving up in"))
        .collect();
    assert!(retries.len() >= 2, "expected retry lines:\n{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: node failed: ")
            && last.contains(&what)
            && last.contains("Connection refused")
            && last.contains("(gave up after 6 s)"),
        "final error: {last}\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// Serve `answer` to every connection on a new port (after reading what the
/// client sent); returns the port.
fn fake_server(answer: &'static [u8]) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(answer);
        }
    });
    port
}

#[test]
fn test_join_address_that_is_not_a_drove_node_fails_at_once() {
    let c = Cluster::start(1, 1);
    let http404 = fake_server(
        b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found",
    );
    let ssh = fake_server(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n");
    let nbd = c.nodes[0].nbd_tcp.trim_start_matches("nbd://").to_string();
    for (what, join) in [
        (
            "an HTTP server without drove's API",
            format!("127.0.0.1:{http404}"),
        ),
        (
            "a server that does not speak HTTP",
            format!("127.0.0.1:{ssh}"),
        ),
        // A node's peer port is not in the list: it serves the internal routes,
        // hello included, so joining through it works.
        ("a drove node's NBD port", nbd),
    ] {
        // No --join-timeout: the default (a minute) must not be waited out.
        let (o, took) = node_run_joining(&join, &[], Duration::from_secs(20));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{what} ({join}): {err}");
        assert!(
            took < Duration::from_secs(15),
            "{what}: took {took:?}: {err}"
        );
        assert!(
            err.contains(&format!("{join} is not the admin address of a drove node"))
                && err.contains("--join takes a member's admin address"),
            "{what} ({join}): {err}"
        );
    }
}
