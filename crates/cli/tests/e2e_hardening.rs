//! Defects a review and a hostile new user found, each shown fixed against real
//! node processes: a second node on a data directory in use, deleting a VDI that
//! clients have open, a node removed from the cluster that kept serving.
mod common;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

/// `drove node run` on a directory a running node uses refuses to start, names the
/// running node's pid, and leaves that node serving (it once replaced its socket).
#[test]
fn test_second_node_on_a_data_directory_in_use_refuses_and_the_first_keeps_serving() {
    let c = Cluster::start(1, 1);
    c.create_vdi("d", "16M", &[]);
    let n = &c.nodes[0];
    let start = Instant::now();
    let o = run(Command::new(drove_bin()).args([
        "node",
        "run",
        "--data",
        &n.data,
        "--zone",
        "z9",
        "--listen",
        "127.0.0.1:0",
        "--peer-listen",
        "127.0.0.1:0",
        "--nbd-listen",
        "127.0.0.1:0",
    ]));
    let t = text(&o);
    assert!(!o.status.success(), "second node started: {t}");
    assert!(t.contains("is in use by another drove node"), "{t}");
    assert!(t.contains(&format!("pid {}", n.pid)), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "refusal took {:?}",
        start.elapsed()
    );
    assert!(std::path::Path::new(&n.nbd_unix).exists(), "socket removed");
    qemu_io(
        &n.uri("d"),
        &["write -P 0x5a 0 64k".into(), "read -P 0x5a 0 64k".into()],
    );
}
