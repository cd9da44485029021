//! End-to-end data path: a real 3-node cluster in 3 zones, copies=3, driven by real
//! NBD clients. Data written through one node is read through another, survives a
//! SIGKILLed node and a restart of the whole cluster.
mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const OBJ: u64 = 4 * MIB;

/// Offsets that matter: the start, both sides of object boundaries, the last block.
fn pattern_cmds(size: u64, verb: &str) -> Vec<String> {
    let spots: Vec<(u64, u64)> = vec![
        (0, 64 << 10),
        (OBJ - 4096, 8192),
        (3 * OBJ - 512, 1024),
        (2 * OBJ - 1000, 3000),
        (7 * OBJ + 12345, 100_000),
        (size / 2, MIB + 4096),
        (size - 4096, 4096),
    ];
    spots
        .iter()
        .enumerate()
        .map(|(i, (off, len))| format!("{verb} -P {} {off} {len}", 0x11 + i * 0x10))
        .collect()
}

#[test]
fn test_patterns_through_one_node_verify_through_another_and_survive_sigkill() {
    if !require(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(3, 3);
    let size = 256 * MIB;
    c.create_vdi("disk", "256M", &["--copies", "3"]);
    let mut w = pattern_cmds(size, "write");
    w.push("flush".into());
    qemu_io(&c.nodes[0].uri("disk"), &w);
    let r = pattern_cmds(size, "read");
    qemu_io(&c.nodes[1].uri("disk"), &r);
    qemu_io(&c.nodes[2].tcp_uri("disk"), &r);
    // Never-written ranges read as zeros.
    qemu_io(&c.nodes[1].uri("disk"), &["read -P 0 100M 1M".to_string()]);

    // Every replica holds every written object: kill one node, reads still verify.
    c.kill(2);
    qemu_io(&c.nodes[0].uri("disk"), &r);
    qemu_io(&c.nodes[1].uri("disk"), &r);

    // Back again: it serves as before.
    c.restart(2);
    qemu_io(&c.nodes[2].uri("disk"), &r);

    // The whole cluster down and up again: VDIs and data are still there.
    c.restart_all();
    let o = c.drove(1, &["vdi", "list", "--json"]);
    assert!(text(&o).contains("\"disk\""), "{}", text(&o));
    qemu_io(&c.nodes[1].uri("disk"), &r);
}

#[test]
fn test_qemu_img_convert_round_trip_is_identical() {
    if !require(&["qemu-img"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.raw");
    let back = tmp.path().join("back.raw");
    let mut data = vec![0u8; 64 << 20];
    let mut x: u64 = 0x1234_5678_9abc_def0;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(&src, &data).unwrap();
    c.create_vdi("img", "64M", &[]);
    let o = run(Command::new("qemu-img").args([
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        src.to_str().unwrap(),
        &c.nodes[0].uri("img"),
    ]));
    assert!(o.status.success(), "convert in: {}", text(&o));
    let o = run(Command::new("qemu-img").args([
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &c.nodes[1].uri("img"),
        back.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "convert out: {}", text(&o));
    assert!(std::fs::read(&back).unwrap() == data, "round trip differs");
    let o = run(Command::new("qemu-img").args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        src.to_str().unwrap(),
        &c.nodes[2].uri("img"),
    ]));
    assert!(o.status.success(), "compare: {}", text(&o));
}

#[test]
fn test_nbdinfo_shows_size_holes_and_fio_verify_passes() {
    if !require(&["nbdinfo", "fio", "qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("sparse", "64M", &[]);
    qemu_io(
        &c.nodes[0].uri("sparse"),
        &["write -P 1 8M 4k".to_string(), "flush".to_string()],
    );
    let o = run(Command::new("nbdinfo").args(["--size", &c.nodes[1].uri("sparse")]));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (64 * MIB).to_string()
    );
    let o = run(Command::new("nbdinfo").args(["--map", "--json", &c.nodes[1].uri("sparse")]));
    assert!(o.status.success(), "{}", text(&o));
    let map: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut data_bytes = 0;
    let mut hole_bytes = 0;
    for e in map.as_array().unwrap() {
        let len = e["length"].as_u64().unwrap();
        if e["type"].as_u64().unwrap() & 1 == 1 {
            hole_bytes += len;
        } else {
            data_bytes += len;
            let off = e["offset"].as_u64().unwrap();
            assert!(
                off <= 8 * MIB && 8 * MIB < off + len,
                "data extent {e} does not hold the write"
            );
        }
    }
    assert_eq!(
        data_bytes, OBJ,
        "exactly the written object is allocated: {map}"
    );
    assert_eq!(hole_bytes, 60 * MIB);
    let o = run(Command::new("nbdinfo").args([
        "--list",
        &format!("nbd+unix://?socket={}", c.nodes[2].nbd_unix),
    ]));
    assert!(text(&o).contains("sparse"), "{}", text(&o));

    c.create_vdi("fio", "64M", &[]);
    let o = run(Command::new("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", c.nodes[0].uri("fio")),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--size=64M",
        "--io_size=16M",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--output-format=json",
    ]));
    assert!(o.status.success(), "fio: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let j: serde_json::Value =
        serde_json::from_str(&out[out.find('{').expect("fio json")..]).expect("fio json");
    assert_eq!(j["jobs"][0]["error"].as_i64(), Some(0), "{j}");
    let metrics = c.metrics(0);
    assert!(
        metrics.contains("drove_nbd_ops_total{op=\"write\",result=\"ok\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("drove_peer_sent_bytes_total"), "{metrics}");
    // The metadata's side: a leader known, entries applied.
    assert!(metrics.contains("\ndrove_meta_quorum 1\n"), "{metrics}");
    assert!(metrics.contains("\ndrove_meta_applied_index "), "{metrics}");
    wait_until(Duration::from_secs(1), "metrics", || true);
}

#[test]
fn test_primary_copy_vdi_replicates_to_every_node() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("pc", "32M", &["--mode", "primary-copy"]);
    let size = 32 * MIB;
    let spots = [(0u64, 4096u64), (OBJ - 100, 200), (size - 8192, 8192)];
    let w: Vec<String> = spots
        .iter()
        .map(|(o, l)| format!("write -P 0x42 {o} {l}"))
        .collect();
    let r: Vec<String> = spots
        .iter()
        .map(|(o, l)| format!("read -P 0x42 {o} {l}"))
        .collect();
    qemu_io(&c.nodes[1].uri("pc"), &w);
    // With copies=3 on 3 nodes every node holds every object: kill two of them and the
    // survivor still reads everything from its own store.
    c.kill(0);
    c.kill(1);
    qemu_io(&c.nodes[2].uri("pc"), &r);
}
