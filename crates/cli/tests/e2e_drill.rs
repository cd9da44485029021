//! The datacenter-loss drill as a benchmark (issue 42), with real node processes on
//! 127.0.0.1, zones joined one at a time: 3 zones x 2 nodes (`drove up --grouped`),
//! and 2 zones x 2 nodes + a witness (`drove up --witness`). Every node of the zone
//! holding the metadata leader (z1 when the witness leads) is SIGKILLed while
//! - a zone-sync VDI homed in a surviving zone is written through a node there (4 KiB
//!   FUA writes, QD1): its longest pause and any I/O error are reported;
//! - a zone-sync VDI homed in the lost zone (`--max-lag 2s`) is written through a
//!   node of the lost zone, every acknowledgement logged: it is promoted to a
//!   surviving zone (`drove vdi promote --yes`) as soon as that is allowed, and
//!   written there. RTO: from the kill to the first write acknowledged after the
//!   promote. RPO: the acknowledged writes it no longer has, and how long before the
//!   kill the oldest of them was acknowledged, against what promote stated.
//!
//! Then the lost zone's nodes start again on their disks, and the time until every
//! node is up and the promoted VDI's copies are identical is reported.
//!
//! `cargo test --release -p drove --test e2e_drill -- --ignored --nocapture bench_drill`
//! (`DROVE_DRILL_RUNS` runs of each layout, 3 by default). The functional drill runs
//! in `make test` as e2e_zones and e2e_witness. Both run with `--down-after 3` (as
//! those tests do), so the figures include a 3 s failure timeout, not the default 5 s.
mod common;
use common::fua::*;
use common::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Layout {
    ThreeZones,
    TwoZonesAndWitness,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::ThreeZones => "3 zones x 2 nodes",
            Layout::TwoZonesAndWitness => "2 zones x 2 nodes + witness",
        }
    }

    fn start(self) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        match self {
            Layout::ThreeZones => Cluster::start_with(dir, 6, 3, &["--grouped"]),
            Layout::TwoZonesAndWitness => Cluster::start_with(dir, 4, 2, &["--witness"]),
        }
    }
}

/// What one drill measured (seconds from the kill unless said otherwise).
struct Drill {
    lost: String,
    pause: f64,
    write_error: Value,
    marked_down: f64,
    promoted: f64,
    rto: f64,
    acked: usize,
    missing: usize,
    oldest_missing: Option<f64>,
    may_lose_ms: u64,
    back: f64,
}

/// The data nodes of zone `z`.
fn in_zone(c: &Cluster, z: &str) -> Vec<usize> {
    (0..c.nodes.len())
        .filter(|&i| c.nodes[i].zone == z && !c.nodes[i].witness)
        .collect()
}

fn drill(layout: Layout) -> Drill {
    let mut c = layout.start();
    let voters_in = |s: &Value| -> usize {
        let mut z: Vec<String> = ids(&s["voters"])
            .iter()
            .map(|&v| c.nodes[index(&c, v)].zone.clone())
            .collect();
        z.sort();
        z.dedup();
        z.len()
    };
    wait_until(
        Duration::from_secs(60),
        "a voter in each of 3 zones",
        || {
            let s = status(&c, 0);
            s["leader"].as_u64().is_some() && voters_in(&s) == 3
        },
    );
    let s = status(&c, 0);
    let leader = s["leader"].as_u64().unwrap();
    let leader_node = &c.nodes[index(&c, leader)];
    let lost = if leader_node.witness {
        "z1".to_string()
    } else {
        leader_node.zone.clone()
    };
    let doomed = in_zone(&c, &lost);
    let kept: Vec<usize> = (0..c.nodes.len())
        .filter(|&i| c.nodes[i].zone != lost && !c.nodes[i].witness)
        .collect();
    let home = c.nodes[kept[0]].zone.clone();
    let o = c.drove(kept[0], &["cluster", "config", "--down-after", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    for (name, zone) in [("far", &home), ("near", &lost)] {
        c.create_vdi(
            name,
            "128M",
            &[
                "--copies",
                "3",
                "--policy",
                "zone-sync",
                "--home-zone",
                zone,
                "--max-lag",
                "2s",
            ],
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let far = writer(&c.nodes[kept[0]].uri("far"), 90, &stop);
    let near = Command::new(PY)
        .args(["-c", ACK_WRITER, &c.nodes[doomed[0]].uri("near"), "30000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let killed_at = unix_now();
    for &i in &doomed {
        c.kill(i);
    }
    let near_out = String::from_utf8_lossy(&near.wait_with_output().unwrap().stdout).to_string();
    let acks = acked(&near_out);
    assert!(
        !acks.is_empty(),
        "the near writer wrote nothing: {near_out}"
    );
    let survivor = kept[1];
    wait_until(Duration::from_secs(60), "the lost zone marked down", || {
        let s = status(&c, survivor);
        doomed
            .iter()
            .all(|&i| s["map"]["nodes"][c.nodes[i].id.to_string()]["state"] == "down")
    });
    let marked_at = unix_now();
    // Promote as soon as it is allowed (a node of the new home zone up in the map).
    let mut promoted = Value::Null;
    wait_until(Duration::from_secs(60), "the promote of 'near'", || {
        let o = c.drove(
            survivor,
            &["vdi", "promote", "near", "--zone", &home, "--yes", "--json"],
        );
        if o.status.success() {
            promoted = serde_json::from_slice(&o.stdout).unwrap_or_default();
        }
        o.status.success()
    });
    let promoted_at = unix_now();
    // Writable from the new home once the dead writer's lease ended.
    let uri = c.nodes[kept[0]].uri("near");
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if try_qemu_io(&uri, &["write -P 0x42 120M 4k".into()])
            .is_ok_and(|out| out.contains("wrote 4096/4096"))
        {
            break;
        }
        assert!(
            Instant::now() < end,
            "'near' not writable 60 s after promote"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let written_at = unix_now();
    // What the promoted VDI holds of what was acknowledged.
    let n = acks.last().unwrap().0 + 1;
    let image = read_image(&uri, dir.path(), (n * 4096) as usize);
    let missing: Vec<f64> = acks
        .iter()
        .filter(|&&(k, _)| image[(k * 4096) as usize..((k + 1) * 4096) as usize] != block(k)[..])
        .map(|&(_, t)| t)
        .collect();
    std::fs::write(&stop, b"").unwrap();
    let sum = summary(far);
    let pause = longest_pause(&sum, killed_at);
    // The lost zone comes back on its disks.
    let back_from = unix_now();
    for &i in &doomed {
        c.restart(i);
    }
    wait_until(
        Duration::from_secs(180),
        "every node up and 'near' identical everywhere",
        || {
            let s = status(&c, survivor);
            let all_up = s["map"]["nodes"]
                .as_object()
                .is_some_and(|m| m.values().all(|n| n["state"] == "up"));
            let o = c.drove(survivor, &["vdi", "check", "near", "--json"]);
            let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            all_up
                && v["identical"] == v["objects"]
                && v["degraded"] == 0
                && v["objects"].as_u64() > Some(0)
        },
    );
    Drill {
        lost,
        pause,
        write_error: sum["error"].clone(),
        marked_down: marked_at - killed_at,
        promoted: promoted_at - killed_at,
        rto: written_at - killed_at,
        acked: acks.len(),
        missing: missing.len(),
        oldest_missing: missing
            .iter()
            .copied()
            .reduce(f64::min)
            .map(|t| killed_at - t),
        may_lose_ms: promoted["may_lose"]["ms"].as_u64().unwrap_or(0),
        back: unix_now() - back_from,
    }
}

/// The table of bench/results/drill-2026-11-27.md.
#[test]
#[ignore]
fn bench_drill() {
    if !require(&["qemu-io", "python3"]) || !have_libnbd() {
        return;
    }
    let runs: usize = std::env::var("DROVE_DRILL_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut rows = Vec::new();
    for layout in [Layout::ThreeZones, Layout::TwoZonesAndWitness] {
        for run in 0..runs {
            let d = drill(layout);
            assert!(d.write_error.is_null(), "a write failed: {}", d.write_error);
            rows.push(format!(
                "| {} | {} | {} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {:.1} |",
                layout.name(),
                run + 1,
                d.lost,
                d.pause,
                d.marked_down,
                d.promoted,
                d.rto,
                d.acked,
                d.missing,
                d.oldest_missing
                    .map_or("-".to_string(), |a| format!("{a:.2} s")),
                d.may_lose_ms,
                d.back
            ));
            eprintln!("{}", rows.last().unwrap());
        }
    }
    println!(
        "| layout | run | zone lost | longest write pause elsewhere (s) | marked down (s) | \
         promoted (s) | RTO: written after promote (s) | acknowledged | missing | oldest missing \
         acknowledged before the kill | promote stated (ms) | back and identical (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
