//! Cluster behaviour with real processes: metadata voters and learners, deleting a
//! VDI frees its objects on every node, and a full disk gives an NBD error for the
//! request that did not fit while everything written before stays readable.
mod common;
use common::*;
use std::path::Path;
use std::process::Command;

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
        "--no-tls",
        "--no-auth",
    ]));
    assert!(o.status.success(), "{}", text(&o));
    let _down = DownOnDrop(mnt.clone());
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
        || status(&c, 0)["map"]["nodes"][dead.to_string()]["state"] == "down",
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

/// `drove cluster health --json` through node `i`: its exit code and its verdict.
fn health(c: &Cluster, i: usize) -> (Option<i32>, serde_json::Value) {
    let o = c.drove(i, &["cluster", "health", "--json"]);
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("health --json is not JSON ({e}): {}", text(&o)));
    (o.status.code(), v)
}

/// The checks of a verdict that are not `ok`, as (check, level).
fn findings(v: &serde_json::Value) -> Vec<(String, String)> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["level"] != "ok")
        .map(|c| {
            (
                c["check"].as_str().unwrap().into(),
                c["level"].as_str().unwrap().into(),
            )
        })
        .collect()
}

#[test]
fn test_health_and_status_tell_nodes_down_and_a_lost_quorum() {
    let c = Cluster::start(3, 3);
    // Every node soon knows of a working majority and finds nothing wrong (but the
    // disk of this machine, which the test does not control).
    for i in 0..3 {
        wait_until(
            std::time::Duration::from_secs(20),
            "a healthy cluster",
            || {
                let (_, v) = health(&c, i);
                findings(&v).iter().all(|(check, _)| check == "disk")
            },
        );
    }
    let (code, v) = health(&c, 0);
    let expected = if findings(&v).is_empty() { 0 } else { 1 };
    assert_eq!(code, Some(expected), "{v}");
    let names: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    for check in ["quorum", "nodes", "recovery", "disk", "clock", "lag"] {
        assert!(names.contains(&check), "{check} missing: {v}");
    }
    let s = status(&c, 0);
    assert_eq!(s["confirmed"], true, "{s}");
    let o = c.drove(0, &["cluster", "health"]);
    let t = text(&o);
    assert!(
        t.contains("(judged by node 1)") && t.contains("3 of 3 nodes up"),
        "{t}"
    );

    // One node gone: a warning naming it (first as not answering, then as down).
    c.kill(2);
    wait_until(
        std::time::Duration::from_secs(30),
        "node 3 reported down",
        || {
            let (code, v) = health(&c, 0);
            code == Some(1) && findings(&v).contains(&("nodes".into(), "warn".into()))
        },
    );
    let (_, v) = health(&c, 0);
    let nodes = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "nodes")
        .unwrap();
    assert!(
        nodes["message"]
            .as_str()
            .unwrap()
            .contains("down: 2 of 3 nodes up"),
        "{v}"
    );

    // Two of three gone: no quorum, an error; status says its view is its last one.
    c.kill(1);
    wait_until(
        std::time::Duration::from_secs(30),
        "no quorum reported",
        || {
            let (code, v) = health(&c, 0);
            code == Some(2) && findings(&v).contains(&("quorum".into(), "err".into()))
        },
    );
    let o = c.drove(0, &["cluster", "health"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(t.starts_with("ERR (judged by node 1)"), "{t}");
    assert!(
        t.contains("last knew of a working metadata majority"),
        "{t}"
    );
    let o = c.drove(0, &["cluster", "status"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.starts_with("WARNING: node 1 last knew of a working metadata majority"),
        "{t}"
    );
    let s = status(&c, 0);
    assert_eq!(s["confirmed"], false, "{s}");
    assert!(s["quorum_age_ms"].as_u64().unwrap() >= 3000, "{s}");

    // Nobody to ask: still a verdict, ERR, exit 2.
    c.kill(0);
    let (code, v) = health(&c, 0);
    assert_eq!(code, Some(2), "{v}");
    assert_eq!(v["status"], "err", "{v}");
}

/// The index in `c.nodes` of the node with metadata id `id`.
fn index_of(c: &Cluster, s: &serde_json::Value, id: u64) -> usize {
    let admin = s["map"]["nodes"][id.to_string()]["admin_addr"]
        .as_str()
        .unwrap_or_else(|| panic!("node {id} not in the map: {s}"));
    c.nodes.iter().position(|n| n.admin == admin).unwrap()
}

#[test]
fn test_a_change_without_an_answer_says_its_outcome_is_unknown_and_a_retry_acts_once() {
    let mut c = Cluster::start(3, 3);
    c.create_vdi("zz", "4M", &[]);
    wait_until(std::time::Duration::from_secs(20), "a quorum", || {
        findings(&health(&c, 0).1)
            .iter()
            .all(|(check, _)| check == "disk")
    });
    // Ask the leader, with the other two gone: it proposes the delete and cannot
    // commit it. (--force: without it the delete first asks every node whether a
    // client has the VDI open, and refuses for sure when two do not answer.)
    let s = status(&c, 0);
    let leader = index_of(&c, &s, s["leader"].as_u64().expect("a leader"));
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &others {
        c.kill(i);
    }
    let o = c.drove(leader, &["vdi", "delete", "zz", "--force"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(err.contains("outcome unknown: "), "{err}");
    assert!(!err.contains("error:"), "{err}");
    let id = err
        .split("--request-id ")
        .nth(1)
        .and_then(|t| t.get(..32))
        .unwrap_or_else(|| panic!("no request id in: {err}"))
        .to_string();
    // The majority comes back; the same change, sent with the id it printed, says
    // what happened (deleted now, or by the first try once the log committed).
    for &i in &others {
        c.restart(i);
    }
    wait_until(
        std::time::Duration::from_secs(60),
        "the quorum back",
        || {
            findings(&health(&c, leader).1)
                .iter()
                .all(|(check, _)| check != "quorum")
        },
    );
    for _ in 0..2 {
        let o = c.drove(
            leader,
            &["vdi", "delete", "zz", "--force", "--request-id", &id],
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    assert!(!c.vdi_names().contains(&"zz".to_string()));
    // A new id is a new change: there is nothing left to delete.
    let o = c.drove(leader, &["vdi", "delete", "zz"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("No VDI named 'zz'"), "{}", text(&o));
    // A bad id is refused before anything is sent.
    let o = c.drove(leader, &["vdi", "delete", "zz", "--request-id", "nope"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("32 hexadecimal digits"), "{}", text(&o));
}

/// A TCP proxy to `upstream` on 127.0.0.1 that, on its first connection, passes the
/// request on and then closes the connection as soon as the answer starts to come
/// back, so the client never sees it; later connections pass both ways.
fn answer_losing_proxy(upstream: String) -> String {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for (n, client) in l.incoming().enumerate() {
            let Ok(mut client) = client else { return };
            let Ok(mut up) = TcpStream::connect(&upstream) else {
                return;
            };
            let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut u2);
                let _ = u2.shutdown(Shutdown::Write);
            });
            if n == 0 {
                let mut buf = [0u8; 4096];
                let _ = up.read(&mut buf);
                let _ = client.shutdown(Shutdown::Both);
                let _ = up.shutdown(Shutdown::Both);
            } else {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut up, &mut client);
                    let _ = client.flush();
                    let _ = client.shutdown(Shutdown::Write);
                });
            }
        }
    });
    addr
}

#[test]
fn test_a_resize_whose_answer_is_lost_is_sent_again_and_applied_once() {
    let c = Cluster::start(1, 1);
    c.create_vdi("g", "1G", &[]);
    let proxy = answer_losing_proxy(c.nodes[0].admin.clone());
    let o = run(Command::new(drove_bin()).args([
        "vdi",
        "resize",
        "g",
        "+1G",
        "--cluster",
        &proxy,
        "--json",
    ]));
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("no definite answer yet"),
        "the first answer was to be lost: {t}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["size"], 2u64 << 30, "{v}");
    let size = |c: &Cluster| {
        let o = c.drove(0, &["vdi", "info", "g", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["size"].as_u64().unwrap()
    };
    assert_eq!(size(&c), 2 << 30, "sent twice, applied once");
    // Another command is another change.
    let o = c.drove(0, &["vdi", "resize", "g", "+1G"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(size(&c), 3 << 30);
}

fn signal_node(c: &Cluster, i: usize, sig: Signal) {
    signal(c.nodes[i].pid, sig);
}

/// A VDI created through one node can be attached at once on any other: a node that
/// has not applied the create yet catches up with the cluster (read barrier) before
/// it answers "no such VDI". The learner (node 3) is stopped (SIGSTOP) while the VDI
/// is created and while a client connects to it, and continued (SIGCONT) with the
/// client's request and the leader's news both waiting for it.
#[test]
fn test_a_vdi_created_through_one_node_attaches_at_once_on_every_other() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(4, 2);
    for round in 0..4 {
        let name = format!("fresh{round}");
        signal_node(&c, 3, Signal::STOP);
        c.create_vdi(&name, "1M", &[]);
        let uri = c.nodes[3].uri(&name);
        let client = std::thread::spawn(move || try_qemu_io(&uri, &["read -P 0 0 4k".into()]));
        std::thread::sleep(std::time::Duration::from_millis(500));
        signal_node(&c, 3, Signal::CONT);
        let out = client
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(out.contains("read 4096/4096"), "round {round}: {out}");
        let n = 1 + round % 2;
        let out = qemu_io(&c.nodes[n].uri(&name), &["read -P 0 0 4k".into()]);
        assert!(
            out.contains("read 4096/4096"),
            "round {round} node {n}: {out}"
        );
    }
    // A name no node knows is still refused, after the node confirmed its view.
    let err = try_qemu_io(&c.nodes[3].uri("never"), &["read 0 4k".into()]).unwrap_err();
    assert!(err.contains("No VDI named 'never'"), "{err}");
}
