//! Snapshots, clones, rollback, flatten and the VDI tree, on real node processes with
//! real clients: a snapshot taken while fio writes with verify, a clone that sees
//! the snapshot while its own writes stay apart from the parent and the VDI, a
//! snapshot deleted while its VDI and a clone read from it (no data copied),
//! `--flatten`, rollback, ephemeral clones, and 100 clones timed against one full
//! copy in the same run.
mod common;
use common::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// qemu-io on a read-only export (a snapshot): open it read-only.
fn qemu_io_ro(uri: &str, cmds: &[String]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-r", "-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let o = run(c.arg(uri));
    let t = text(&o);
    assert!(
        o.status.success() && !t.contains("failed") && !t.contains("error"),
        "qemu-io -r on {uri}: {t}"
    );
    t
}

fn ok(o: &std::process::Output, what: &str) -> String {
    assert!(o.status.success(), "{what} failed: {}", text(o));
    text(o)
}

fn fio_verify(uri: &str) -> Child {
    Command::new("fio")
        .args([
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--iodepth=16",
            "--size=32M",
            "--io_size=24M",
            "--rate=8M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio")
}

#[test]
fn test_snapshot_under_fio_load_then_clone_sees_it_and_writes_stay_apart() {
    if !require(&["fio", "qemu-io", "qemu-img"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("base", "64M", &["--copies", "3"]);
    let (n0, n1, n2) = (&c.nodes[0], &c.nodes[1], &c.nodes[2]);
    // A region fio never touches, to check the snapshot exactly.
    qemu_io(&n0.uri("base"), &["write -P 0xa1 40M 8M".into()]);
    let load = fio_verify(&n0.uri("base"));
    std::thread::sleep(Duration::from_millis(1500));
    // Asked through the second node; the first writes the VDI, so the request goes
    // there and the snapshot falls between two of fio's writes.
    let t = Instant::now();
    let o = c.drove(1, &["vdi", "snapshot", "base", "s1", "--json"]);
    let snap: Value = serde_json::from_str(&ok(&o, "snapshot under load")).unwrap();
    eprintln!("snapshot under load took {:?}", t.elapsed());
    assert_eq!(snap["snapshot"]["snapshot"], true);
    assert_eq!(snap["vdi"]["parent"], snap["snapshot"]["id"]);
    fio_ok(load, "across the snapshot");

    // The VDI goes on; the snapshot keeps what was there.
    qemu_io(&n0.uri("base"), &["write -P 0xb2 40M 4M".into()]);
    let o = c.drove(2, &["vdi", "clone", "s1", "c1"]);
    ok(&o, "clone");
    qemu_io(
        &n2.uri("c1"),
        &["read -P 0xa1 40M 8M".into(), "write -P 0xc3 44M 1M".into()],
    );
    qemu_io(
        &n1.uri("c1"),
        &[
            "read -P 0xa1 40M 4M".into(),
            "read -P 0xc3 44M 1M".into(),
            "read -P 0xa1 45M 3M".into(),
        ],
    );
    qemu_io(
        &n2.uri("base"),
        &["read -P 0xb2 40M 4M".into(), "read -P 0xa1 44M 4M".into()],
    );
    qemu_io_ro(&n1.uri("s1"), &["read -P 0xa1 40M 8M".into()]);

    // What fio left in the snapshot is what the clone reads (the clone wrote
    // only at 44M).
    let dir = tempfile::tempdir().unwrap();
    let file = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    for (uri, f) in [(n1.uri("s1"), file("s1")), (n0.uri("c1"), file("c1"))] {
        let o = run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &uri, &f]));
        ok(&o, "qemu-img convert");
    }
    let o =
        run(Command::new("cmp").args(["-n", &(40 << 20).to_string(), &file("s1"), &file("c1")]));
    ok(&o, "the clone's first 40M equal the snapshot's");

    // A snapshot is read-only: NBD says so, and writes are refused.
    let o = run(Command::new("qemu-io").args(["-f", "raw", "-c", "write 0 4k", &n0.uri("s1")]));
    assert!(!o.status.success(), "writing a snapshot: {}", text(&o));
    qemu_io_ro(&n1.uri("s1"), &["read -P 0xa1 40M 8M".into()]);
}

#[test]
fn test_tree_flatten_rollback_and_ephemeral_clones() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("base", "32M", &["--copies", "2"]);
    let (n0, n1) = (&c.nodes[0], &c.nodes[1]);
    qemu_io(&n0.uri("base"), &["write -P 0x11 0 12M".into()]);
    ok(&c.drove(0, &["vdi", "snapshot", "base", "s1"]), "snapshot");
    ok(&c.drove(1, &["vdi", "clone", "s1", "c1"]), "clone");
    qemu_io(&n1.uri("c1"), &["write -P 0x22 4M 4k".into()]);

    // The tree: s1 at the root with base and c1 under it; c1 owns one object.
    let o = c.drove(2, &["vdi", "tree", "--json"]);
    let rows: Value = serde_json::from_str(&ok(&o, "tree")).unwrap();
    let row = |n: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} not in {rows}"))
    };
    let mut kids: Vec<String> = row("s1")["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    kids.sort();
    assert_eq!(kids, ["base", "c1"]);
    assert_eq!(row("c1")["parent_name"], "s1");
    assert_eq!(row("c1")["objects"], 2, "one object copied up, 2 copies");
    assert_eq!(row("s1")["objects"], 6, "three 4M objects, 2 copies");
    let bytes = row("s1")["bytes_on_disk"].as_u64().unwrap();
    assert!((24 << 20..=26 << 20).contains(&bytes), "{bytes}");
    let text_tree = ok(&c.drove(0, &["vdi", "tree"]), "tree");
    assert!(
        text_tree.contains("s1  [snapshot]") && text_tree.contains("── c1"),
        "{text_tree}"
    );

    // Rollback throws away what base wrote since s2.
    ok(
        &c.drove(0, &["vdi", "snapshot", "base", "s2"]),
        "snapshot s2",
    );
    qemu_io(&n0.uri("base"), &["write -P 0x33 0 8M".into()]);
    // The node gives the write lock up after qemu-io has disconnected and exited
    // (flush, then a metadata commit); until then a rollback is refused as "in use".
    wait_until(
        std::time::Duration::from_secs(20),
        "base's lock released",
        || {
            let o = c.drove(1, &["vdi", "info", "base", "--json"]);
            serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .is_ok_and(|v| v["lock"].is_null())
        },
    );
    ok(&c.drove(1, &["vdi", "rollback", "base", "s2"]), "rollback");
    qemu_io(&n1.uri("base"), &["read -P 0x11 0 12M".into()]);
    let o = c.drove(1, &["vdi", "rollback", "base", "c1"]);
    assert!(
        !o.status.success(),
        "c1 is no snapshot of base: {}",
        text(&o)
    );

    // --flatten: the clones get their own copies, then the snapshot goes.
    let o = c.drove(0, &["vdi", "delete", "s1", "--flatten"]);
    assert!(!o.status.success(), "s2 still reads from s1: {}", text(&o));
    ok(
        &c.drove(0, &["vdi", "delete", "s2", "--flatten"]),
        "delete s2",
    );
    ok(
        &c.drove(0, &["vdi", "delete", "s1", "--flatten"]),
        "delete s1",
    );
    let names = c.vdi_names();
    assert!(!names.contains(&"s1".to_string()) && !names.contains(&"s2".to_string()));
    qemu_io(&n0.uri("base"), &["read -P 0x11 0 12M".into()]);
    qemu_io(
        &n0.uri("c1"),
        &[
            "read -P 0x11 0 4M".into(),
            "read -P 0x22 4M 4k".into(),
            "read -P 0x11 4100k 8092k".into(),
        ],
    );

    // An ephemeral clone goes when its last writer detaches.
    ok(
        &c.drove(0, &["vdi", "snapshot", "c1", "gold"]),
        "snapshot gold",
    );
    // Through the node the client attaches to: it answers once it serves the clone.
    ok(
        &c.drove(1, &["vdi", "clone", "gold", "tmp", "--ephemeral"]),
        "ephemeral clone",
    );
    qemu_io(
        &n1.uri("tmp"),
        &["read -P 0x22 4M 4k".into(), "write -P 0x44 0 4k".into()],
    );
    wait_until(Duration::from_secs(10), "the ephemeral clone to go", || {
        !c.vdi_names().contains(&"tmp".to_string())
    });
}

/// Bytes of `vdi`'s own objects on disk, all replicas, from `vdi tree --json`
/// (`name` as the tree shows it: a deleted snapshot by its old name).
fn own_bytes(c: &Cluster, name: &str) -> u64 {
    let o = c.drove(0, &["vdi", "tree", "--json"]);
    let rows: Value = serde_json::from_str(&ok(&o, "tree")).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            let n = r["name"].as_str().unwrap();
            n == name || drove_types::kept_original(n) == Some(name)
        })
        .map(|r| r["bytes_on_disk"].as_u64().unwrap())
        .sum()
}

/// Issue 43, defect 9: deleting a snapshot of a live VDI told the user to delete
/// their own disk first and offered --flatten, which copies the data. Now it is
/// deleted by name at once, without copying: its blocks stay for the VDI (and a
/// clone) that read from them, the name can be taken again, and the blocks go
/// with the last reader.
#[test]
fn test_a_snapshot_of_a_live_vdi_is_deleted_without_copying_its_data() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("vm", "32M", &["--copies", "2"]);
    let n0 = &c.nodes[0];
    qemu_io(&n0.uri("vm"), &["write -P 0x11 0 16M".into()]);
    ok(&c.drove(0, &["vdi", "snapshot", "vm", "mon"]), "snapshot");
    ok(&c.drove(0, &["vdi", "clone", "mon", "web"]), "clone");
    qemu_io(&n0.uri("vm"), &["write -P 0x22 4M 4k".into()]);
    let before = own_bytes(&c, "mon");
    assert!(before >= 32 << 20, "16M over 2 copies: {before}");

    let o = c.drove(1, &["vdi", "delete", "mon"]);
    let t = ok(&o, "delete mon");
    assert!(
        t.contains("Deleted snapshot 'mon'") && t.contains("vm, web"),
        "{t}"
    );
    assert!(!c.vdi_names().contains(&"mon".to_string()));
    // Nothing was copied: the snapshot's blocks are where they were, and the VDI
    // owns no more than the one object it wrote since.
    assert_eq!(own_bytes(&c, "mon"), before);
    assert!(
        own_bytes(&c, "vm") <= 2 * (4 << 20),
        "{}",
        own_bytes(&c, "vm")
    );
    let tree = ok(&c.drove(2, &["vdi", "tree"]), "tree");
    assert!(tree.contains("mon  [deleted snapshot"), "{tree}");
    // Both readers still read it, through any node.
    for n in &c.nodes {
        qemu_io(
            &n.uri("vm"),
            &["read -P 0x11 0 4M".into(), "read -P 0x22 4M 4k".into()],
        );
        qemu_io(&n.uri("web"), &["read -P 0x11 0 16M".into()]);
    }
    // The name is free again.
    ok(
        &c.drove(0, &["vdi", "snapshot", "vm", "mon"]),
        "snapshot mon again",
    );
    // The last readers go: so do the blocks (every node collects them).
    ok(&c.drove(0, &["vdi", "delete", "web"]), "delete web");
    ok(&c.drove(0, &["vdi", "delete", "mon"]), "delete the new mon");
    ok(&c.drove(0, &["vdi", "delete", "vm"]), "delete vm");
    wait_until(Duration::from_secs(30), "every block collected", || {
        c.nodes
            .iter()
            .map(|n| object_files(std::path::Path::new(&n.data)))
            .sum::<usize>()
            == 0
    });
    let o = c.drove(0, &["vdi", "list", "--json"]);
    let all: Value = serde_json::from_str(&ok(&o, "list")).unwrap();
    assert_eq!(all, serde_json::json!([]));
}

#[test]
fn test_hundred_clones_of_a_1g_image_against_one_full_copy() {
    if !require(&["qemu-img", "nbdcopy"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("img", "1G", &["--copies", "3"]);
    let n0 = &c.nodes[0];
    // 1 GiB of data that does not compress to holes.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("img.raw");
    let o = run(Command::new("sh").args([
        "-c",
        &format!("head -c 1G /dev/urandom > {}", src.display()),
    ]));
    ok(&o, "random image");
    let o = run(Command::new("nbdcopy").args([src.to_str().unwrap(), &n0.uri("img")]));
    ok(&o, "fill the image");
    ok(&c.drove(0, &["vdi", "snapshot", "img", "gold"]), "snapshot");

    // One full copy: what cloning would cost without copy-on-write.
    c.create_vdi("copy", "1G", &["--copies", "3"]);
    let t = Instant::now();
    let o = run(Command::new("qemu-img").args([
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        &n0.uri("gold"),
        &n0.uri("copy"),
    ]));
    ok(&o, "full copy");
    let copy = t.elapsed();

    let names: Vec<String> = (1..=100).map(|i| format!("vm{i}")).collect();
    let mut args = vec!["vdi", "clone", "gold"];
    args.extend(names.iter().map(|s| s.as_str()));
    let t = Instant::now();
    ok(&c.drove(1, &args), "100 clones");
    let clones = t.elapsed();
    let t = Instant::now();
    for i in 1..=5 {
        ok(
            &c.drove(2, &["vdi", "clone", "gold", &format!("one{i}")]),
            "one clone",
        );
    }
    let one = t.elapsed() / 5;
    let ratio = clones.as_secs_f64() / copy.as_secs_f64();
    eprintln!(
        "full copy of 1 GiB: {copy:?}; 100 clones in one command: {clones:?} ({:.2}% of the copy); one clone per command: {one:?}",
        ratio * 100.0
    );
    // The target (< 1 %) is a figure for the notes and bench results; the test
    // only rules out clones that copy data.
    assert!(
        ratio < 0.2,
        "100 clones took {clones:?}, a full copy {copy:?}"
    );
    let o = run(Command::new("qemu-img").args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        &c.nodes[2].uri("vm100"),
        &c.nodes[1].uri("copy"),
    ]));
    ok(&o, "clone vm100 reads the image");
}
