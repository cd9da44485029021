//! A full disk under a whole cluster: three real nodes whose data directories share
//! one 48 MiB tmpfs, a 64 MiB VDI filled by qemu-img. The client gets ENOSPC (not
//! EIO), data written before reads back through every node, the nodes stay up and
//! their metadata keeps working (it has the store's reserve to write its log in),
//! `cluster health` says ERR naming the disk, and once a VDI is deleted the cluster
//! is healthy and takes writes again, with no restart.
//!
//! Mounting a tmpfs needs root; CI runs as root, and there a test that cannot mount
//! fails rather than passing unrun.
mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Mounts a tmpfs at `dir` for the life of the value.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        if !is_root() {
            return Err("mounting a tmpfs needs root".to_string());
        }
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let o = run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir));
        if !o.status.success() {
            return Err(format!("cannot mount a tmpfs: {}", text(&o).trim()));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

fn health(c: &Cluster, i: usize) -> (i32, serde_json::Value) {
    let o = c.drove(i, &["cluster", "health", "--json"]);
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("health --json: {e}: {}", text(&o)));
    (o.status.code().unwrap_or(-1), v)
}

fn findings(h: &serde_json::Value, check: &str) -> Vec<String> {
    h["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == check && c["level"] != "ok")
        .map(|c| c["message"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn test_a_full_disk_gives_enospc_keeps_reads_and_metadata_and_heals_by_itself() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let mnt = base.path().join("small");
    let Some(_fs) = require_ok(Tmpfs::mount(&mnt, "48M")) else {
        return;
    };
    let c = Cluster::start_in(tempfile::tempdir_in(&mnt).unwrap(), 3, 3);
    c.create_vdi("keep", "8M", &[]);
    c.create_vdi("big", "64M", &[]);
    qemu_io(
        &c.nodes[0].uri("keep"),
        &["write -P 0x33 0 8M".into(), "flush".into()],
    );

    // Fill: 64 MiB of data, three copies, on 48 MiB.
    let img = base.path().join("rand.img");
    let o = run(Command::new("head")
        .args(["-c", "64M", "/dev/urandom"])
        .stdout(std::fs::File::create(&img).unwrap()));
    assert!(o.status.success());
    let o = run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&img)
        .arg(c.nodes[0].uri("big")));
    assert!(!o.status.success(), "64 MiB x 3 fit on 48 MiB?");
    assert!(
        text(&o).contains("No space left on device"),
        "the client must see ENOSPC, not EIO: {}",
        text(&o)
    );

    // Data written before reads back through every node, and every node is up.
    for n in &c.nodes {
        qemu_io(&n.uri("keep"), &["read -P 0x33 0 8M".into()]);
    }
    let o = c.drove(1, &["node", "list", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let map: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes = map["nodes"].as_object().unwrap();
    assert_eq!(nodes.len(), 3, "{map}");
    for n in nodes.values() {
        assert_eq!(n["state"], "up", "a full disk is no failed node: {map}");
    }
    // Health names the disk and what it means, from any node.
    let (code, h) = health(&c, 2);
    assert_eq!(code, 2, "ERR: {h}");
    let disks = findings(&h, "disk");
    assert!(
        disks
            .iter()
            .any(|m| m.contains(&*mnt.to_string_lossy()) && m.contains("ENOSPC")),
        "{h}"
    );
    assert!(findings(&h, "meta").is_empty(), "{h}");

    // The metadata still commits (the store left it room): a VDI is made and the
    // big one deleted through a node that is not the leader.
    let o = c.drove(1, &["vdi", "create", "small", "1M"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(2, &["vdi", "delete", "big", "--force"]);
    assert!(o.status.success(), "{}", text(&o));

    // With the space back the cluster is healthy again by itself, and takes writes.
    wait_until(
        Duration::from_secs(60),
        "health OK after the delete",
        || health(&c, 0).0 == 0,
    );
    qemu_io(
        &c.nodes[1].uri("small"),
        &["write -P 0x44 0 1M".into(), "flush".into()],
    );
    for n in &c.nodes {
        qemu_io(&n.uri("small"), &["read -P 0x44 0 1M".into()]);
        qemu_io(&n.uri("keep"), &["read -P 0x33 0 8M".into()]);
    }
    let (_, h) = health(&c, 1);
    assert!(findings(&h, "meta").is_empty(), "{h}");
}
