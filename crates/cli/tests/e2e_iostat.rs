//! `drove vdi iostat` against fio's own figures, with real node processes: two VDIs
//! under known loads through two different nodes (4 KiB random writes paced at 150
//! a second through node 1, 4 KiB random reads paced at 400 a second through node
//! 2), the cluster-wide iostat asked of node 3 (which serves neither), and each
//! VDI's rates compared with what fio reports it did. Also: `/metrics` of the node
//! serving a VDI names it in the per-VDI rates, and bad arguments are refused.
mod common;
use common::*;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// fio through `uri`: 4 KiB random `rw` paced at `iops` for `secs` seconds.
fn fio(name: &str, uri: &str, rw: &str, iops: u32, secs: u32) -> Child {
    Command::new("fio")
        .args([
            &format!("--name={name}"),
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            "--bs=4k",
            "--iodepth=4",
            "--size=32M",
            &format!("--rate_iops={iops}"),
            "--time_based=1",
            &format!("--runtime={secs}"),
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio")
}

/// The rate fio reports for `what` (read or write) of its only job.
fn fio_iops(j: &serde_json::Value, what: &str) -> f64 {
    j["jobs"][0][what]["iops"].as_f64().unwrap()
}

#[test]
fn test_iostat_agrees_with_fio_on_two_vdis_through_two_nodes() {
    if !require(&["fio"]) {
        return;
    }
    let c = Cluster::start(3, 1);
    c.create_vdi("slow", "32M", &[]);
    c.create_vdi("fast", "32M", &[]);
    let w = fio("w", &c.nodes[0].uri("slow"), "randwrite", 150, 16);
    let r = fio("r", &c.nodes[1].uri("fast"), "randread", 400, 16);
    // The first second or two (connect, ramp) are left out of the measure.
    std::thread::sleep(Duration::from_secs(3));
    let o = c.drove(
        2,
        &["vdi", "iostat", "--json", "--interval", "3", "--count", "3"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let wj = fio_ok(w, "paced writes");
    let rj = fio_ok(r, "paced reads");
    let (want_w, want_r) = (fio_iops(&wj, "write"), fio_iops(&rj, "read"));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{}", text(&o));
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(l["nodes"], 3, "{l}");
        let vdi = |name: &str| {
            l["vdis"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["vdi"] == name)
                .unwrap_or_else(|| panic!("{name} missing from interval {k}: {l}"))
                .clone()
        };
        let (s, f) = (vdi("slow"), vdi("fast"));
        let got_w = s["write_iops"].as_f64().unwrap();
        let got_r = f["read_iops"].as_f64().unwrap();
        eprintln!(
            "interval {k}: slow {got_w:.1} writes/s (fio {want_w:.1}), fast {got_r:.1} \
             reads/s (fio {want_r:.1}); write p99 {} ms, read p99 {} ms",
            s["write_p99_ms"], f["read_p99_ms"]
        );
        assert!(
            (got_w - want_w).abs() <= 0.1 * want_w,
            "slow: {got_w} writes/s against fio's {want_w}: {l}"
        );
        assert!(
            (got_r - want_r).abs() <= 0.1 * want_r,
            "fast: {got_r} reads/s against fio's {want_r}: {l}"
        );
        // Each VDI did only what its fio did.
        assert_eq!(s["read_iops"].as_f64(), Some(0.0), "{l}");
        assert_eq!(f["write_iops"].as_f64(), Some(0.0), "{l}");
        let bytes = s["write_bytes_per_s"].as_f64().unwrap();
        assert!((bytes - got_w * 4096.0).abs() < 1.0, "{l}");
        assert!(s["write_p50_ms"].as_f64().unwrap() > 0.0, "{l}");
        assert_eq!(s["errors"], 0, "{l}");
    }
    // The node writing `slow` names it in its per-VDI rates (a 10 s window that
    // fio's 16 s covered at least once).
    let m = c.metrics(0);
    assert!(
        m.lines().any(
            |l| l.starts_with("drove_vdi_iops{vdi=\"slow\",op=\"write\"}") && !l.ends_with(" 0.0")
        ),
        "{m}"
    );
    assert!(!m.contains("vdi=\"fast\""), "node 1 serves only slow: {m}");
}

#[test]
fn test_iostat_refuses_bad_arguments_and_shows_a_named_idle_vdi() {
    let c = Cluster::start(1, 1);
    for (args, want) in [
        (
            &["--interval", "0.1"][..],
            "Bad --interval 0.1: use 0.2 to 3600 seconds",
        ),
        (&["--count", "0"], "Bad --count 0: use 1 or more"),
        (&["--sort", "speed"], "invalid value 'speed'"),
    ] {
        let mut a = vec!["vdi", "iostat"];
        a.extend_from_slice(args);
        let o = c.drove(0, &a);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
    let o = c.drove(
        0,
        &["vdi", "iostat", "idle", "--interval", "0.2", "--count", "1"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with("idle ") && l.contains(" 0 ")),
        "{out}"
    );
}
