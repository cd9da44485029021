//! Per-VDI I/O limits with real node processes and a real client (fio through
//! NBD): a write IOPS limit holds fio, unpaced at queue depth 8, to the limit; a
//! change made with `vdi set` while fio runs holds it to the new limit within a
//! second, on the same connection; the time waited shows in `/metrics`. The
//! cluster's default limits reach new VDIs and their clones, 0 lifts a limit, and
//! bad limits are refused with one clear line.
mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Per-second write IOPS from fio's log, as (second since fio started, IOPS).
fn iops_log(path: &std::path::Path) -> Vec<(f64, f64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            // msec, value, direction (1: write), ...
            (f.len() >= 3 && f[2] == "1").then(|| {
                (
                    f[0].parse::<f64>().unwrap() / 1000.0,
                    f[1].parse::<f64>().unwrap(),
                )
            })
        })
        .collect()
}

fn mean(xs: &[(f64, f64)], from: f64, to: f64) -> f64 {
    let v: Vec<f64> = xs
        .iter()
        .filter(|(t, _)| *t > from && *t <= to)
        .map(|(_, x)| *x)
        .collect();
    assert!(!v.is_empty(), "no sample between {from} and {to} s: {xs:?}");
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn test_a_write_iops_limit_holds_fio_and_a_live_change_takes_effect_at_once() {
    if !require(&["fio"]) {
        return;
    }
    let c = Cluster::start(3, 1);
    c.create_vdi(
        "capped",
        "64M",
        &["--write-iops-limit", "100", "--burst", "100ms"],
    );
    let o = c.drove(0, &["vdi", "info", "capped"]);
    assert!(
        text(&o).contains("I/O limits:  write 100 IOPS; burst 100 ms"),
        "{}",
        text(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("w");
    let fio = Command::new("fio")
        .args([
            "--name=w",
            "--ioengine=nbd",
            &format!("--uri={}", c.nodes[0].uri("capped")),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--size=64M",
            "--time_based=1",
            "--runtime=14",
            "--log_avg_msec=1000",
            &format!("--write_iops_log={}", log.display()),
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio");
    let started = Instant::now();
    // `vdi iostat` shows the time fio's requests wait for the limit.
    std::thread::sleep(Duration::from_secs(1));
    let o = c.drove(
        2,
        &[
            "vdi",
            "iostat",
            "capped",
            "--json",
            "--count",
            "1",
            "--interval",
            "3",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = &j["vdis"][0];
    let waited = row["throttled_ms_per_s"].as_f64().unwrap();
    let iops = row["write_iops"].as_f64().unwrap();
    eprintln!("iostat: {iops:.0} writes/s, {waited:.0} ms/s waited for the limit");
    // Eight requests in flight at 100 IOPS: each waits about 70 ms.
    assert!(
        (80.0..=120.0).contains(&iops) && waited > 2000.0,
        "fio at QD8 under 100 IOPS: {row}"
    );
    // Change the limit while fio writes, on the connection it has open.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(started.elapsed()));
    let set_at = started.elapsed().as_secs_f64();
    let o = c.drove(1, &["vdi", "set", "capped", "--write-iops-limit", "300"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("I/O limits write 300 IOPS; burst 100 ms"),
        "{}",
        text(&o)
    );
    let j = fio_ok(fio, "writes under a limit");
    assert_eq!(j["jobs"][0]["error"], 0, "{j}");
    let samples = iops_log(&dir.path().join("w_iops.1.log"));
    // fio's clock starts a little after ours (it connects first): its seconds
    // are at most ours, so the change is in effect from `set_at` + 1 s of fio's.
    let before = mean(&samples, 1.0, set_at - 1.0);
    let after = mean(&samples, set_at + 2.0, 14.0);
    eprintln!("{before:.1} writes/s before the change, {after:.1} after: {samples:?}");
    assert!(
        (90.0..=110.0).contains(&before),
        "{before} writes/s under a limit of 100"
    );
    assert!(
        (270.0..=330.0).contains(&after),
        "{after} writes/s under a limit of 300"
    );
    let m = c.metrics(0);
    let waited: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("drove_qos_throttled_seconds_total{op=\"write\"} "))
        .unwrap_or_else(|| panic!("no throttled time: {m}"))
        .parse()
        .unwrap();
    assert!(waited > 1.0, "fio at QD8 waited {waited} s for the limit");
    // Lifted: the VDI is unlimited again.
    let o = c.drove(0, &["vdi", "set", "capped", "--write-iops-limit", "0"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("I/O limits unlimited"), "{}", text(&o));
}

#[test]
fn test_default_limits_reach_new_vdis_and_clones_and_bad_limits_are_refused() {
    let c = Cluster::start(1, 1);
    let o = c.drove(
        0,
        &[
            "cluster",
            "config",
            "--bps-limit",
            "10M",
            "--read-iops-limit",
            "500",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("new VDIs' I/O:  read 500 IOPS, 10M/s; write 10M/s; burst 1 s"),
        "{}",
        text(&o)
    );
    // A VDI's own flags change the default; 0 lifts one of its limits.
    c.create_vdi(
        "d",
        "16M",
        &["--write-bps-limit", "0", "--write-iops-limit", "50"],
    );
    let info = |name: &str| -> serde_json::Value {
        let o = c.drove(0, &["vdi", "info", name, "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["qos"].clone()
    };
    let want = serde_json::json!({"read_iops": 500, "write_iops": 50, "read_bps": 10485760});
    assert_eq!(info("d"), want);
    let o = c.drove(0, &["vdi", "snapshot", "d", "s"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(0, &["vdi", "clone", "s", "k"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(info("k"), want, "a clone starts with its snapshot's limits");
    for (args, want) in [
        (
            &["vdi", "set", "d", "--write-bps-limit", "1K"][..],
            "Bad write bytes/s limit 1024: use 4K to 1T per second (0 lifts it)",
        ),
        (
            &["vdi", "set", "d", "--iops-limit", "lots"],
            "invalid value 'lots'",
        ),
        (
            &["vdi", "set", "d", "--burst", "5m"],
            "Bad burst 300000 ms: use 100 ms to 60 s",
        ),
        (&["vdi", "set", "d"], "Nothing to change"),
        (
            &["vdi", "set", "nope", "--iops-limit", "5"],
            "No VDI named 'nope'",
        ),
        (
            &["vdi", "create", "e", "16M", "--read-iops-limit", "20000000"],
            "Bad read IOPS limit 20000000: use 1 to 10000000",
        ),
    ] {
        let o = c.drove(0, args);
        assert!(!o.status.success(), "{args:?}");
        // One line says what is wrong (clap adds its "try --help" below its own).
        let first = text(&o)
            .trim()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        assert!(first.contains(want), "{args:?}: {}", text(&o));
    }
    assert_eq!(info("d"), want, "nothing refused changed the VDI");
}
