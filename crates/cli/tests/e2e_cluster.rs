//! Cluster behaviour with real processes: metadata voters and learners, deleting a
//! VDI frees its objects on every node, and a full disk gives an NBD error for the
//! request that did not fit while everything written before stays readable.
mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn object_files(data: &Path) -> usize {
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

#[test]
fn test_four_nodes_have_three_voters_and_a_learner_and_delete_frees_objects() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(4, 2);
    let o = c.drove(3, &["cluster", "status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["voters"].as_array().unwrap().len(), 3, "{s}");
    assert_eq!(s["learners"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(s["map"]["nodes"].as_object().unwrap().len(), 4);
    let zones: Vec<&str> = c.nodes.iter().map(|n| n.zone.as_str()).collect();
    assert_eq!(zones, ["z1", "z2", "z1", "z2"]);

    c.create_vdi("gone", "64M", &["--copies", "2"]);
    let writes: Vec<String> = (0..16)
        .map(|i| format!("write -P 7 {} 4k", i * (4 << 20)))
        .collect();
    qemu_io(&c.nodes[3].uri("gone"), &writes);
    let total: usize = c
        .nodes
        .iter()
        .map(|n| object_files(Path::new(&n.data)))
        .sum();
    assert_eq!(total, 32, "16 objects x 2 copies");
    let o = c.drove(2, &["vdi", "delete", "gone"]);
    assert!(o.status.success(), "{}", text(&o));
    wait_until(
        std::time::Duration::from_secs(10),
        "objects deleted everywhere",
        || {
            c.nodes
                .iter()
                .map(|n| object_files(Path::new(&n.data)))
                .sum::<usize>()
                == 0
        },
    );
}

/// Mounts a small tmpfs at `dir` for the life of the value (root only).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).ok()?;
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .ok()?;
        if !o.status.success() {
            skip(&format!("cannot mount a tmpfs ({})", text(&o).trim()));
            return None;
        }
        Some(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

#[test]
fn test_full_disk_fails_the_request_and_keeps_earlier_data() {
    if !require(&["qemu-io"]) {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let mnt = base.path().join("small");
    let Some(_fs) = Tmpfs::mount(&mnt, "48M") else {
        return;
    };
    // One node whose data directory is the small tmpfs.
    let o = run(Command::new(drove_bin()).args([
        "up",
        "--nodes",
        "1",
        "--dir",
        mnt.to_str().unwrap(),
        "--detach",
        "--base-port",
        "0",
    ]));
    assert!(o.status.success(), "{}", text(&o));
    struct Down(std::path::PathBuf);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = Command::new(drove_bin())
                .args(["down", "--dir"])
                .arg(&self.0)
                .output();
        }
    }
    let _down = Down(mnt.clone());
    let f: serde_json::Value =
        serde_json::from_slice(&std::fs::read(mnt.join("cluster.json")).unwrap()).unwrap();
    let admin = f["nodes"][0]["admin"].as_str().unwrap().to_string();
    let sock = f["nodes"][0]["nbd_unix"].as_str().unwrap().to_string();
    let o =
        run(Command::new(drove_bin()).args(["vdi", "create", "big", "256M", "--cluster", &admin]));
    assert!(o.status.success(), "{}", text(&o));
    let uri = format!("nbd+unix:///big?socket={sock}");
    qemu_io(&uri, &["write -P 0x33 0 8M".into(), "flush".into()]);

    // Fill: 1 MiB writes until the disk refuses one.
    let mut refused = None;
    for i in 8..256u64 {
        let o = run(Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            &format!("write -P 0x44 {} 1M", i << 20),
            &uri,
        ]));
        let t = text(&o);
        if t.contains("No space left on device") {
            refused = Some(i);
            break;
        }
        assert!(
            !t.contains("rror") || t.contains("No space"),
            "unexpected: {t}"
        );
    }
    let at = refused.expect("a 48 MiB disk must refuse part of a 256 MiB VDI");
    assert!(at > 8, "some writes fit before the disk was full");
    eprintln!("disk full after {at} MiB: the write at {at} MiB got ENOSPC");
    // Earlier data still reads back, from the same node, which still serves.
    qemu_io(
        &uri,
        &["read -P 0x33 0 8M".into(), "read -P 0x44 8M 1M".into()],
    );
    let o = run(Command::new(drove_bin()).args(["cluster", "status", "--cluster", &admin]));
    assert!(o.status.success(), "node still answers: {}", text(&o));
}

/// `drove cluster status --json` through node `i`.
fn status(c: &Cluster, i: usize) -> serde_json::Value {
    let o = c.drove(i, &["cluster", "status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    let mut ids: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    ids.sort();
    ids
}

#[test]
fn test_a_dead_voter_is_removed_and_a_learner_takes_its_vote() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(4, 2);
    c.create_vdi("kept", "32M", &["--copies", "2"]);
    let uri = c.nodes[0].uri("kept");
    let writes: Vec<String> = (0..8)
        .map(|i| format!("write -P {} {} 1M", i + 1, i * (4 << 20)))
        .collect();
    qemu_io(&uri, &writes);
    let (dead, up) = (c.nodes[1].id, c.nodes[2].id);
    let s = status(&c, 0);
    assert!(ids(&s["voters"]).contains(&dead), "{s}");

    // An up node is drained by `leave`, never removed outright.
    let o = c.drove(0, &["node", "remove", &up.to_string()]);
    assert!(!o.status.success(), "removing an up node must fail");
    assert!(text(&o).contains("node leave"), "{}", text(&o));
    let o = c.drove(0, &["node", "remove", "99"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("No node 99"), "{}", text(&o));

    c.kill(1);
    wait_until(
        std::time::Duration::from_secs(30),
        "the dead node marked down",
        || status(&c, 0)["map"]["nodes"][dead.to_string()]["state"] == "Down",
    );
    let o = c.drove(0, &["node", "remove", &dead.to_string(), "--json"]);
    assert!(o.status.success(), "node remove: {}", text(&o));
    let s = status(&c, 3);
    assert!(s["map"]["nodes"].get(dead.to_string()).is_none(), "{s}");
    assert_eq!(s["map"]["nodes"].as_object().unwrap().len(), 3, "{s}");
    let all: Vec<u64> = c
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|&i| i != dead)
        .collect();
    assert_eq!(ids(&s["voters"]), all, "the learner took the vote: {s}");
    assert!(ids(&s["learners"]).is_empty(), "{s}");
    let removed = format!("node {dead} removed");
    let history = s["epoch_history"].as_array().unwrap();
    assert!(
        history.iter().any(|r| r["change"] == removed.as_str()),
        "no `{removed}` in the epoch history: {history:?}"
    );
    // The data is all there, through every node left.
    let reads: Vec<String> = (0..8)
        .map(|i| format!("read -P {} {} 1M", i + 1, i * (4 << 20)))
        .collect();
    for i in [0, 2, 3] {
        qemu_io(&c.nodes[i].uri("kept"), &reads);
    }
    // The metadata still commits with the new voters.
    c.create_vdi("after", "4M", &[]);
}
