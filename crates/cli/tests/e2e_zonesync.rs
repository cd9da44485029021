//! Zone-sync with real node processes and a real emulated WAN: four nodes in two
//! zones, every cross-zone peer connection through its own toxiproxy proxy (as
//! `drove bench paper` lays it out), fio writing through the NBD unix socket.
//! - With a 10 ms delay each way, a zone-sync VDI's 4 KiB writes do not wait for the
//!   WAN (a sync VDI's do, which proves the delay is in effect); after `drove vdi
//!   sync` the remote copies agree (`vdi check`).
//! - With the link to the far zone throttled below the writer's speed, the lag stays
//!   within its bound (sampled from `/api/vdis/NAME/lag` all along), the writer is
//!   slowed, and the copies converge once the throttle is lifted.
mod common;
use common::fua::*;
use common::*;
use drove_paperbench::procs::Cancel;
use drove_paperbench::toxiproxy::{find_binary, Toxiproxy};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A four-node, two-zone cluster whose cross-zone peer traffic goes through
/// toxiproxy: the cluster, the proxy server, and the proxy names from a z1 node to a
/// z2 node (the direction writes from z1 take).
struct Wan {
    c: Cluster,
    toxi: Toxiproxy,
    all: Vec<String>,
    z1_to_z2: Vec<String>,
    _log: tempfile::TempDir,
}

fn wan_cluster() -> Option<Wan> {
    if !require(&["fio"]) {
        return None;
    }
    let bin = require_ok(find_binary().ok_or_else(|| {
        "toxiproxy not installed (scripts/install-deps.sh installs it with go install)".to_string()
    }))?;
    let log = tempfile::tempdir().unwrap();
    let toxi = Toxiproxy::start(&bin, &log.path().join("toxiproxy.log"), &Cancel::new())
        .expect("toxiproxy starts");
    let c = Cluster::start(4, 2);
    let mut all = Vec::new();
    let mut z1_to_z2 = Vec::new();
    for a in &c.nodes {
        let mut routes = BTreeMap::new();
        for b in c.nodes.iter().filter(|b| b.zone != a.zone) {
            let name = format!("p{}-{}", a.id, b.id);
            let listen = toxi.create_proxy(&name, &b.peer).unwrap();
            routes.insert(b.peer.clone(), listen);
            if a.zone == "z1" {
                z1_to_z2.push(name.clone());
            }
            all.push(name);
        }
        let path = std::path::Path::new(&a.data).join("peer-routes.json");
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string(&routes).unwrap()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    Some(Wan {
        c,
        toxi,
        all,
        z1_to_z2,
        _log: log,
    })
}

/// The index of the first node of zone z1 (the writer's node: it becomes home).
fn z1_node(c: &Cluster) -> usize {
    c.nodes.iter().position(|n| n.zone == "z1").unwrap()
}

fn uri(c: &Cluster, i: usize, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", c.nodes[i].nbd_unix)
}

/// Run fio against `uri` and return its JSON.
fn fio(uri: &str, args: &[&str]) -> Value {
    let o = Command::new("fio")
        .args([
            "--name=w",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--output-format=json",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("fio runs");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "fio failed: {}", text(&o));
    let i = out.find('{').expect("fio printed JSON");
    serde_json::from_str(&out[i..]).expect("fio JSON")
}

/// Median completion latency of fio's writes, in milliseconds.
fn write_p50_ms(v: &Value) -> f64 {
    let p = &v["jobs"][0]["write"]["clat_ns"]["percentile"]["50.000000"];
    p.as_f64().expect("a p50 write latency") / 1e6
}

/// 4 KiB random writes, one at a time, for `secs` seconds.
fn small_writes(c: &Cluster, i: usize, name: &str, secs: u32) -> f64 {
    let v = fio(
        &uri(c, i, name),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=1",
            "--size=64M",
            "--time_based",
            &format!("--runtime={secs}"),
        ],
    );
    write_p50_ms(&v)
}

fn checked_identical(c: &Cluster, name: &str) {
    let v = json_of(c, 0, &["vdi", "check", name, "--json"]);
    assert_eq!(v["identical"], v["objects"], "{v}");
    assert!(v["objects"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn test_zone_sync_small_writes_do_not_wait_for_the_wan_and_sync_catches_up() {
    let Some(w) = wan_cluster() else { return };
    let c = &w.c;
    let i = z1_node(c);
    c.create_vdi("zs", "64M", &["--copies", "3", "--policy", "zone-sync"]);
    c.create_vdi("sy", "64M", &["--copies", "3"]);
    let zs0 = small_writes(c, i, "zs", 3);
    let sy0 = small_writes(c, i, "sy", 3);
    for p in &w.all {
        w.toxi.add_latency(p, 10).unwrap();
    }
    let sy1 = small_writes(c, i, "sy", 3);
    let zs1 = small_writes(c, i, "zs", 3);
    eprintln!(
        "4 KiB write p50: zone-sync {zs0:.3} ms -> {zs1:.3} ms with 10 ms delay (x{:.2}); \
         sync {sy0:.3} ms -> {sy1:.3} ms (x{:.2})",
        zs1 / zs0,
        sy1 / sy0
    );
    assert!(
        sy1 >= 20.0,
        "the delay is in effect: sync writes wait a WAN round trip ({sy1} ms)"
    );
    // The figure is 1.5x; 1 ms more is for a busy machine's scheduling
    // noise on sub-millisecond writes. A WAN round trip here is 20 ms.
    assert!(
        zs1 <= 1.5 * zs0 + 1.0,
        "zone-sync writes do not wait for the WAN: p50 {zs1} ms against {zs0} ms without delay"
    );
    let info = json_of(c, 0, &["vdi", "info", "zs", "--json"]);
    assert_eq!(info["policy"], "zone-sync", "{info}");
    assert_eq!(info["home_zone"], "z1", "{info}");
    // Sync: the remote copies catch up (over the delayed link) and agree.
    let o = c.drove(0, &["vdi", "sync", "zs", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["lag_after"]["writes"], 0, "{s}");
    checked_identical(c, "zs");
    checked_identical(c, "sy");
}

#[test]
fn test_the_lag_stays_within_its_bound_when_the_writer_outruns_the_link() {
    let Some(w) = wan_cluster() else { return };
    let c = &w.c;
    let i = z1_node(c);
    c.create_vdi(
        "lag",
        "256M",
        &["--copies", "3", "--policy", "zone-sync", "--max-lag", "2s"],
    );
    // Attach once so that z1 becomes home, before throttling.
    small_writes(c, i, "lag", 1);
    let o = c.drove(0, &["vdi", "sync", "lag"]);
    assert!(o.status.success(), "{}", text(&o));
    // 2 MB/s to the far zone; fio writes sequentially as fast as it can.
    for p in &w.z1_to_z2 {
        w.toxi.add_bandwidth(p, 2048).unwrap();
    }
    let target = uri(c, i, "lag");
    let writer = std::thread::spawn(move || {
        fio(
            &target,
            &[
                "--rw=write",
                "--bs=1M",
                "--iodepth=4",
                "--size=256M",
                "--time_based",
                "--runtime=8",
            ],
        )
    });
    let admin = c.nodes[0].admin.clone();
    let mut worst_s: f64 = 0.0;
    let mut worst_b: u64 = 0;
    let mut samples = 0;
    let start = Instant::now();
    while !writer.is_finished() && start.elapsed() < Duration::from_secs(60) {
        let r = drove_paperbench::http::get_ok(&admin, "/api/vdis/lag/lag", Duration::from_secs(5))
            .expect("lag answers");
        let v: Value = serde_json::from_str(&r).unwrap();
        worst_s = worst_s.max(v["seconds"].as_f64().unwrap());
        worst_b = worst_b.max(v["bytes"].as_u64().unwrap());
        samples += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let fio_out = writer.join().unwrap();
    let mb_s = fio_out["jobs"][0]["write"]["bw"].as_f64().unwrap() / 1024.0;
    eprintln!(
        "writer {mb_s:.1} MB/s over a 2 MB/s link: worst lag {worst_s:.2} s, {worst_b} bytes \
         in {samples} samples (bound 2 s, 256 MiB)"
    );
    assert!(samples >= 20, "{samples} samples");
    assert!(worst_b > 0, "the writer outran the link");
    assert!(worst_s <= 2.0, "lag {worst_s} s over its 2 s bound");
    assert!(worst_b <= 256 << 20, "lag {worst_b} bytes over its bound");
    assert!(
        mb_s < 8.0,
        "the writer was slowed to about the link's speed: {mb_s} MB/s"
    );
    let m = c.metrics(i);
    assert!(
        m.lines().any(|l| l.starts_with("drove_zone_sync_throttled_writes_total ")
            && !l.ends_with(" 0")),
        "writers waited at the bound"
    );
    for p in &w.z1_to_z2 {
        w.toxi.remove_toxic(p, "bandwidth_upstream").unwrap();
    }
    let o = c.drove(0, &["vdi", "sync", "lag"]);
    assert!(o.status.success(), "{}", text(&o));
    checked_identical(c, "lag");
}

/// The first `blocks` 4 KiB blocks of VDI `name`, read through node `i`.
fn read_blocks(c: &Cluster, i: usize, name: &str, blocks: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    read_image(&uri(c, i, name), dir.path(), (blocks * 4096) as usize)
}

/// Every node of the home zone is killed while a sync and a zone-sync VDI are
/// written through one of them over a slow, throttled WAN. Both stay readable from
/// the other zone; after `drove vdi promote` they are writable there. The sync VDI
/// has every acknowledged write; the zone-sync VDI misses only writes acknowledged
/// within the lag bound that promote states before it acts.
#[test]
fn test_losing_the_home_zone_loses_nothing_under_sync_and_at_most_the_stated_lag_under_zone_sync() {
    let Some(w) = wan_cluster() else { return };
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let py = "/usr/bin/python3";
    let have_nbd = Command::new(py)
        .args(["-c", "import nbd"])
        .status()
        .is_ok_and(|s| s.success());
    let nbd = if have_nbd {
        Ok(())
    } else {
        Err("python3-libnbd is not installed (scripts/install-deps.sh installs it)".to_string())
    };
    if require_ok(nbd).is_none() {
        return;
    }
    let c = &w.c;
    // The home is the zone with fewer metadata voters: the others keep a majority.
    let voters: Vec<u64> = status(c, 0)["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let votes = |z: &str| {
        c.nodes
            .iter()
            .filter(|n| n.zone == z && voters.contains(&n.id))
            .count()
    };
    let (home, far) = if votes("z1") <= votes("z2") {
        ("z1", "z2")
    } else {
        ("z2", "z1")
    };
    let home_nodes: Vec<usize> = (0..c.nodes.len())
        .filter(|&i| c.nodes[i].zone == home)
        .collect();
    let f = (0..c.nodes.len())
        .find(|&i| c.nodes[i].zone == far)
        .unwrap();
    let o = c.drove(f, &["cluster", "config", "--down-after", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    let g = home_nodes[0];
    for (name, policy) in [("sy", "sync"), ("zs", "zone-sync")] {
        c.create_vdi(
            name,
            "64M",
            &[
                "--copies",
                "3",
                "--policy",
                policy,
                "--home-zone",
                home,
                "--max-lag",
                "2s",
            ],
        );
    }
    // A slow WAN from the home zone: 10 ms each way, 512 KB/s to the far zone.
    for p in &w.all {
        w.toxi.add_latency(p, 10).unwrap();
    }
    for p in &w.all {
        let from_home = c
            .nodes
            .iter()
            .any(|n| n.zone == home && p.starts_with(&format!("p{}-", n.id)));
        if from_home {
            w.toxi.add_bandwidth(p, 512).unwrap();
        }
    }
    let writers: Vec<_> = ["sy", "zs"]
        .iter()
        .map(|name| {
            Command::new(py)
                .args(["-c", ACK_WRITER, &uri(c, g, name), "16384"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    let lag = drove_paperbench::http::get_ok(
        &c.nodes[g].admin,
        "/api/vdis/zs/lag",
        Duration::from_secs(5),
    )
    .expect("lag answers");
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for &i in &home_nodes {
        c.kill(i);
    }
    let outs: Vec<String> = writers
        .into_iter()
        .map(|w| String::from_utf8_lossy(&w.wait_with_output().unwrap().stdout).to_string())
        .collect();
    let (sy_acked, zs_acked) = (acked(&outs[0]), acked(&outs[1]));
    if sy_acked.is_empty() || zs_acked.is_empty() {
        // A writer failed before the kill (seen once in CI under load): the gateway's
        // warnings and errors say where its write failed.
        let log = std::fs::read_to_string(std::path::Path::new(&c.nodes[g].data).join("node.log"))
            .unwrap_or_default();
        let tail: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .rev()
            .take(40)
            .collect();
        panic!(
            "a writer failed before the kill: {outs:?}\ngateway node {} log (newest first):\n{}",
            c.nodes[g].id,
            tail.join("\n")
        );
    }
    // Promote needs a node of the far zone up in the map. A gateway of the home zone
    // may have marked a far node down while the slow link timed its calls out (issue
    // 46's false mark-down; a CI run met it here once): the new leader marks it up
    // again at its next heartbeat, which the test waits for and reports.
    let mut far_seen_down = false;
    wait_until(
        Duration::from_secs(120),
        "the home zone marked down and the far zone up",
        || {
            let s = status(c, f);
            let state = |i: usize| s["map"]["nodes"][c.nodes[i].id.to_string()]["state"].clone();
            let home_down = home_nodes.iter().all(|&i| state(i) == "down");
            let far_up = (0..c.nodes.len())
                .filter(|&i| c.nodes[i].zone == far)
                .all(|i| state(i) == "up");
            if home_down && !far_up && !far_seen_down {
                far_seen_down = true;
                eprintln!(
                    "the home zone is down and a far node is not up yet: {}",
                    s["map"]["nodes"]
                );
            }
            home_down && far_up
        },
    );

    // Promote: the zone-sync VDI first says what may be missing and changes nothing.
    let o = c.drove(f, &["vdi", "promote", "zs", "--zone", far]);
    assert!(!o.status.success(), "promote without --yes: {}", text(&o));
    let said = text(&o);
    assert!(
        said.contains("may miss") && said.contains("2.0 s") && said.contains("--yes"),
        "{said}"
    );
    assert_eq!(
        json_of(c, f, &["vdi", "info", "zs", "--json"])["home_zone"],
        home
    );
    let zs = json_of(
        c,
        f,
        &["vdi", "promote", "zs", "--zone", far, "--yes", "--json"],
    );
    assert_eq!(zs["home_zone"], far, "{zs}");
    assert_eq!(zs["may_lose"]["ms"], 2000, "{zs}");
    let max_bytes = zs["may_lose"]["bytes"].as_u64().unwrap();
    let sy = json_of(c, f, &["vdi", "promote", "sy", "--zone", far, "--json"]);
    assert_eq!(
        (&sy["home_zone"], &sy["may_lose"]),
        (&Value::from(far), &Value::Null),
        "{sy}"
    );

    // Read back through the far zone.
    let check = |name: &str, acks: &[(u64, f64)]| -> (usize, f64) {
        let n = acks.last().unwrap().0 + 1;
        let disk = read_blocks(c, f, name, n);
        let mut missing = 0;
        let mut oldest_missing = f64::INFINITY;
        for &(k, t) in acks {
            let at = (k * 4096) as usize;
            if disk[at..at + 4096] != block(k)[..] {
                missing += 1;
                oldest_missing = oldest_missing.min(t);
            }
        }
        (missing, killed_at - oldest_missing)
    };
    let (sy_missing, _) = check("sy", &sy_acked);
    let (zs_missing, zs_age) = check("zs", &zs_acked);
    eprintln!(
        "home zone {home} killed: sync {} writes acknowledged, {sy_missing} missing; zone-sync \
         {} acknowledged, {zs_missing} missing{} (lag just before the kill: {lag}; promote \
         stated 2.0 s, {max_bytes} bytes)",
        sy_acked.len(),
        zs_acked.len(),
        if zs_missing > 0 {
            format!(", the oldest acknowledged {zs_age:.2} s before the kill")
        } else {
            String::new()
        }
    );
    assert_eq!(sy_missing, 0, "sync loses no acknowledged write");
    assert!(
        zs_missing == 0 || zs_age <= 2.0,
        "a zone-sync write acknowledged {zs_age} s before the kill is missing"
    );
    assert!((zs_missing as u64) * 4096 <= max_bytes);

    // Writable from the far zone once the dead writer's lease has ended: until then a
    // write waits a few seconds for the lock and fails (EIO), and the client retries.
    for name in ["sy", "zs"] {
        wait_until(
            Duration::from_secs(60),
            "a write from the far zone",
            || match try_qemu_io(&uri(c, f, name), &["write -P 0x42 32M 64k".into()]) {
                Ok(out) => out.contains("wrote 65536/65536"),
                Err(e) => {
                    eprintln!(
                        "{name}: not yet writable from {far}: {}",
                        e.lines().last().unwrap_or("")
                    );
                    false
                }
            },
        );
        let back = qemu_io(&uri(c, f, name), &["read -P 0x42 32M 64k".into()]);
        assert!(back.contains("read 65536/65536"), "{back}");
    }
}
