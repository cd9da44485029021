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

fn json_of(c: &Cluster, i: usize, args: &[&str]) -> Value {
    let o = c.drove(i, args);
    assert!(o.status.success(), "drove {args:?}: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
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
