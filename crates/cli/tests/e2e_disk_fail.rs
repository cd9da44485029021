//! A replica whose disk fails under writes (issue 46, item 2): EIO on every access,
//! or fsync failing while writes still land in the page cache. The node's store
//! latches as failed and refuses everything, the node marks itself down naming the
//! disk and stays down (no flapping), `cluster health` names node and disk, the
//! other nodes re-replicate its objects, and nothing acknowledged is lost.
//!
//! The fault is injected with the test-only hook `DROVE_DISK_FAULTS` (device mapper
//! is not available everywhere): every node of the cluster gets it, each reading
//! the control file `DATA/disk-faults`, and the test writes `eio` or `fsync` into
//! the victim's.
mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// fio through `uri`: 4 KiB random writes, each followed by a FLUSH, paced to last
/// about 6 s, then every block read back and checked (crc32c headers). With
/// `verify_only`, only the read-back of what the same job wrote.
fn fio(uri: &str, verify_only: bool) -> Child {
    let mut c = paced_fio("diskfail", uri, 4);
    if verify_only {
        c.arg("--verify_only");
    }
    c.spawn().expect("fio")
}

fn node_state(c: &Cluster, id: u64) -> String {
    c.status()["map"]["nodes"][id.to_string()]["state"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn vdi_check(c: &Cluster, i: usize) -> Value {
    let o = c.drove(i, &["vdi", "check", "d", "--json"]);
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

/// Four nodes, a VDI with three copies written by fio through node 1; the disk of
/// a replica that is neither node 1 nor the metadata leader fails with `fault`.
/// With `replace`, the disk is then replaced (emptied) and the node restarted.
fn disk_fails_under_writes(fault: &str, first: &str, replace: bool) {
    let mut c = Cluster::start_cmd(tempfile::tempdir().unwrap(), 4, 1, &[], |up| {
        up.env("DROVE_DISK_FAULTS", "disk-faults");
    });
    c.create_vdi("d", "64M", &["--copies", "3"]);
    let leader = c.status()["leader"].as_u64().unwrap();
    let victim = c.nodes[1..]
        .iter()
        .find(|n| n.id != leader)
        .cloned()
        .expect("a replica that is not the metadata leader");
    let data = Path::new(&victim.data);
    let load = fio(&c.nodes[0].uri("d"), false);
    // Fail the disk once the victim holds some of fio's writes.
    wait_until(
        Duration::from_secs(30),
        "fio's writes on the victim",
        || object_files(data) >= 2,
    );
    std::fs::write(data.join("disk-faults"), fault).unwrap();
    let failed_at = Instant::now();
    let j = fio_ok(load, "writes and verify under the failure");
    assert!(
        failed_at.elapsed() > Duration::from_secs(1),
        "fio must have written after the disk failed"
    );
    let written = j["jobs"][0]["write"]["total_ios"].as_u64().unwrap_or(0);
    assert!(written >= 3000, "fio wrote too little: {j}");

    // Marked down, with the disk and its first failure named in the history.
    let store = data.join("store");
    let disk = format!("The disk at {} failed (", store.display());
    wait_until(Duration::from_secs(10), "the victim marked down", || {
        node_state(&c, victim.id) == "down"
    });
    let history = c.status()["epoch_history"].to_string();
    let down = format!("node {} Up -> Down", victim.id);
    assert!(history.contains(&down), "{history}");
    assert!(history.contains(&disk), "{disk} not in {history}");
    // The first failure, as the store saw it (a dead disk may fail a flush first).
    assert!(history.contains(first), "{first} not in {history}");

    // `cluster health` names the node and the disk, in text and in JSON.
    let o = c.drove(0, &["cluster", "health", "--json"]);
    let h: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("cluster health --json: {e}: {}", text(&o)));
    let named = format!("node {}: {disk}", victim.id);
    let check = h["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "disk" && c["message"].as_str().unwrap().contains(&named))
        .cloned()
        .unwrap_or_else(|| panic!("no disk check naming {named}: {h}"));
    assert_eq!(check["level"], "err", "{h}");
    assert_eq!(h["status"], "err", "{h}");
    let o = c.drove(0, &["cluster", "health"]);
    assert!(text(&o).contains(&named), "{}", text(&o));

    // It stays down: the failure detector hears its heartbeats but they say its
    // disk failed. Watched for 5 s (several heartbeats and detector rounds).
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(5) {
        assert_eq!(node_state(&c, victim.id), "down", "the victim came back up");
        std::thread::sleep(Duration::from_millis(250));
    }
    let history = c.status()["epoch_history"].to_string();
    assert_eq!(history.matches(&down).count(), 1, "{history}");
    let up = format!("node {} Down -> Up", victim.id);
    assert!(!history.contains(&up), "{history}");

    // The other three nodes restore three identical copies of every object.
    wait_until(Duration::from_secs(120), "re-replication", || {
        let v = vdi_check(&c, 0);
        v["identical"] == v["objects"] && v["degraded"] == 0 && v["objects"].as_u64() > Some(0)
    });
    let v = vdi_check(&c, 2);
    let objects = v["objects"].as_u64().unwrap() as usize;
    assert!(objects >= 2, "{v}");
    // Three copies on the three nodes left: each holds every object.
    for n in c.nodes.iter().filter(|n| n.id != victim.id) {
        assert_eq!(object_files(Path::new(&n.data)), objects, "node {}", n.id);
    }
    eprintln!(
        "{fault}: {written} writes acknowledged, re-replicated {:.1} s after the failure: {v}",
        failed_at.elapsed().as_secs_f64()
    );
    // Every block fio wrote reads back as written, through another node.
    let other = c
        .nodes
        .iter()
        .find(|n| n.id != victim.id && n.id != c.nodes[0].id)
        .unwrap();
    fio_ok(fio(&other.uri("d"), true), "read-back after re-replication");
    // The victim still serves nothing from its disk.
    assert_eq!(node_state(&c, victim.id), "down");
    if !replace {
        return;
    }

    // The operator replaces the disk (an empty store) and restarts the node: it
    // comes back up, recovery copies its share back onto it, and every block reads
    // back through it.
    let i = c.nodes.iter().position(|n| n.id == victim.id).unwrap();
    c.kill(i);
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::remove_file(data.join("disk-faults")).unwrap();
    c.restart(i);
    wait_until(Duration::from_secs(30), "the victim back up", || {
        node_state(&c, victim.id) == "up"
    });
    // `vdi check` once said identical (asked of the returning node) before its new
    // disk held 2 objects (1 run in about 10, three tests at once): the copies on
    // the new disk are waited for too, with the same bound.
    wait_until(
        Duration::from_secs(120),
        "recovery onto the new disk",
        || {
            let v = vdi_check(&c, i);
            v["identical"] == v["objects"]
                && v["degraded"] == 0
                && v["objects"].as_u64() > Some(0)
                && object_files(data) >= 2
        },
    );
    let held = object_files(data);
    assert!(held >= 2, "the new disk holds {held} objects");
    eprintln!("{fault}: after the disk was replaced the node holds {held} objects");
    fio_ok(
        fio(&victim.uri("d"), true),
        "read-back through the restarted node",
    );
}

#[test]
fn test_eio_disk_marks_the_node_down_and_its_objects_are_re_replicated_and_a_new_disk_is_refilled()
{
    if !require(&["fio"]) {
        return;
    }
    disk_fails_under_writes("eio", "Input/output error (os error 5)) at ", true);
}

#[test]
fn test_failed_fsync_marks_the_node_down_and_its_objects_are_re_replicated() {
    if !require(&["fio"]) {
        return;
    }
    disk_fails_under_writes("fsync", "(fsync failed: fsync (injected", false);
}

/// A disk that fails with no client writing: reads through the failed node itself
/// (its gateway reads its own copies first) still return the data, from the other
/// copies, and the node marks itself down, naming its disk, and stays down.
#[test]
fn test_a_disk_failing_without_writes_marks_its_node_down_and_reads_through_it_go_on() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start_cmd(tempfile::tempdir().unwrap(), 4, 1, &[], |up| {
        up.env("DROVE_DISK_FAULTS", "disk-faults");
    });
    c.create_vdi("r", "16M", &["--copies", "3"]);
    qemu_io(
        &c.nodes[0].uri("r"),
        &["write -P 0x5a 0 16M".into(), "flush".into()],
    );
    let leader = c.status()["leader"].as_u64().unwrap();
    let victim = c.nodes[1..]
        .iter()
        .find(|n| n.id != leader && object_files(Path::new(&n.data)) > 0)
        .cloned()
        .expect("a replica that is not the metadata leader");
    let data = Path::new(&victim.data);
    std::fs::write(data.join("disk-faults"), "eio").unwrap();
    let read = ["read -P 0x5a 0 16M".to_string()];
    // qemu-io fails on an error or a pattern mismatch.
    qemu_io(&victim.uri("r"), &read);
    wait_until(Duration::from_secs(10), "the victim marked down", || {
        node_state(&c, victim.id) == "down"
    });
    let history = c.status()["epoch_history"].to_string();
    let disk = format!("The disk at {} failed (", data.join("store").display());
    assert!(history.contains(&disk), "{disk} not in {history}");
    let down = format!("node {} Up -> Down", victim.id);
    // Down, it still serves as a gateway, from the other copies.
    qemu_io(&victim.uri("r"), &read);
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(4) {
        assert_eq!(node_state(&c, victim.id), "down", "the victim came back up");
        std::thread::sleep(Duration::from_millis(250));
    }
    let history = c.status()["epoch_history"].to_string();
    assert_eq!(history.matches(&down).count(), 1, "{history}");
    let shown: Vec<&str> = history.split("\"change\":").skip(5).collect();
    eprintln!("{shown:?}");
}
