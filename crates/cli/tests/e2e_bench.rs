//! `drove bench paper --quick` end to end, with the real binary, a real cluster,
//! real qemu-nbd, fio and drove's WAN proxy: the outputs are complete (every point of both
//! systems, drove with the sync policy and the baseline, positive throughput), the
//! indexes in results.md are the ones the measured numbers give, and the charts
//! exist when matplotlib is installed. Both policies in one run take about 60%
//! longer; their tables and schedule are unit-tested in drove-paperbench.
mod common;
use common::require_ok;
use drove_paperbench::toxiproxy::WanProxyKind;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn rows(csv: &str) -> Vec<HashMap<String, String>> {
    let mut lines = csv.lines();
    let header: Vec<String> = lines
        .next()
        .expect("results.csv is empty")
        .split(',')
        .map(str::to_string)
        .collect();
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), header.len(), "bad row: {l}");
            header
                .iter()
                .cloned()
                .zip(f.iter().map(|s| s.to_string()))
                .collect()
        })
        .collect()
}

fn mean(rows: &[HashMap<String, String>], system: &str, op: &str, x: u32, d: u32) -> f64 {
    let r = rows
        .iter()
        .find(|r| {
            r["system"] == system
                && r["op"] == op
                && r["x"] == x.to_string()
                && r["delay_ms"] == d.to_string()
        })
        .unwrap_or_else(|| panic!("no row {system} {op} X={x} delay={d}"));
    r["mean_per_client_mbps"].parse().unwrap()
}

/// The cells of the table row of `section` that starts with `| op | x |`.
fn md_row(md: &str, section: &str, op: &str, x: u32) -> Vec<String> {
    let start = md
        .find(section)
        .unwrap_or_else(|| panic!("no section {section} in results.md"));
    let body = &md[start..];
    let end = body[section.len()..]
        .find("\n## ")
        .map_or(body.len(), |e| e + section.len());
    let prefix = format!("| {op} | {x} |");
    let line = body[..end]
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no row '{prefix}' in {section}"));
    line.trim_matches('|')
        .split('|')
        .map(|c| c.trim().trim_end_matches('*').to_string())
        .collect()
}

#[test]
fn test_bench_paper_quick_outputs_are_complete() {
    let missing = drove_paperbench::missing_tools(WanProxyKind::Builtin);
    let found = if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{} not installed", missing.join("; ")))
    };
    if require_ok(found).is_none() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_drove"))
        .args(["bench", "paper", "--quick", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success(),
        "drove bench paper --quick failed:\n{log}"
    );
    eprintln!("drove bench paper --quick took {secs:.0} s");
    assert!(
        log.contains("[point 32/32"),
        "no progress line for the last point:\n{log}"
    );
    assert!(log.contains("ETA"), "{log}");

    let csv = std::fs::read_to_string(out.path().join("results.csv")).unwrap();
    let rows = rows(&csv);
    assert_eq!(rows.len(), 2 * 4 * 2 * 2, "{csv}");
    for system in ["drove", "baseline"] {
        for op in ["block-write", "block-read", "small-write", "small-read"] {
            for x in [1, 2] {
                for d in [0, 10] {
                    assert!(
                        mean(&rows, system, op, x, d) > 0.0,
                        "{system} {op} X={x} {d} ms: {csv}"
                    );
                }
            }
        }
    }
    for r in &rows {
        let per: Vec<f64> = r["per_client_mbps"]
            .split(';')
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(
            per.len().to_string(),
            r["x"],
            "one figure per client: {r:?}"
        );
        assert!(per.iter().all(|v| *v > 0.0), "{r:?}");
        assert!(r["cpu_bound"] == "true" || r["cpu_bound"] == "false");
        assert!(r["client_bytes"].parse::<u64>().unwrap() > 0, "{r:?}");
    }
    // drove's writes are replicated: bytes move between nodes, and across zones.
    let w = rows
        .iter()
        .find(|r| {
            r["system"] == "drove"
                && r["op"] == "block-write"
                && r["x"] == "1"
                && r["delay_ms"] == "0"
        })
        .unwrap();
    assert!(w["peer_sent_bytes"].parse::<u64>().unwrap() > 0);
    assert!(w["cross_zone_sent_bytes"].parse::<u64>().unwrap() > 0);

    // The indexes in results.md are computed from results.csv's numbers.
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    let close = |shown: &str, want: f64| {
        let v: f64 = shown
            .parse()
            .unwrap_or_else(|_| panic!("'{shown}' is not a number"));
        assert!(
            (v - want).abs() < 0.011,
            "results.md shows {v}, results.csv gives {want:.4}"
        );
    };
    let cells = md_row(&md, "## ParallelismImpactRatio", "block-write", 2);
    close(
        &cells[2],
        mean(&rows, "drove", "block-write", 2, 0) / mean(&rows, "drove", "block-write", 1, 0),
    );
    close(
        &cells[5],
        mean(&rows, "baseline", "block-write", 2, 10)
            / mean(&rows, "baseline", "block-write", 1, 10),
    );
    let cells = md_row(&md, "## LatencyImpactRatio", "small-read", 2);
    close(
        &cells[2],
        mean(&rows, "drove", "small-read", 2, 10) / mean(&rows, "drove", "small-read", 2, 0),
    );
    close(
        &cells[3],
        mean(&rows, "baseline", "small-read", 2, 10) / mean(&rows, "baseline", "small-read", 2, 0),
    );
    assert!(
        md.contains("88 nodes"),
        "results.md must state the paper's scale"
    );
    // --quick measures one write policy (sync) unless --policy says otherwise.
    assert!(md.contains("write policy sync)"), "{md}");
    assert!(
        rows.iter().all(|r| r["system"] != "drove-zone-sync"),
        "{csv}"
    );
    assert!(md.contains("## CPU-bound points"));
    assert!(md.contains("## Transfer efficiency"));

    let have_mpl = Command::new("python3")
        .args(["-c", "import matplotlib"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    for png in [
        "throughput.png",
        "parallelism_impact_ratio.png",
        "latency_impact_ratio.png",
    ] {
        let p = out.path().join(png);
        if have_mpl {
            let bytes = std::fs::read(&p).unwrap_or_else(|_| panic!("{png} missing"));
            assert!(bytes.starts_with(b"\x89PNG"), "{png} is not a PNG");
        } else {
            assert!(!Path::new(&p).exists(), "{png} drawn without matplotlib?");
            assert!(md.contains("Charts skipped"), "{md}");
        }
    }
    // Nothing is left running and the work directory is gone.
    let leftovers: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("work-"))
        .collect();
    assert!(leftovers.is_empty(), "work directory left behind");
}

/// `drove bench paper` runs its own cluster (plain HTTP, no token) and calls it
/// with its own credentials: a user who exported DROVE_CA, DROVE_TOKEN_FILE and
/// DROVE_CLUSTER for another cluster, as `drove up` tells them to, got "received
/// corrupt message of type InvalidContentType" from the bench's first `vdi create`.
/// Here they name files that are no CA and no token, and an address nothing serves.
#[test]
fn test_bench_paper_calls_its_own_cluster_whatever_the_environment_says() {
    let missing = drove_paperbench::missing_tools(WanProxyKind::Builtin);
    let found = if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{} not installed", missing.join("; ")))
    };
    if require_ok(found).is_none() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let junk = out.path().join("junk");
    std::fs::write(&junk, "not a certificate, not a token\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_drove"))
        .args(["bench", "paper", "--quick", "--nodes-per-zone", "1"])
        .args(["--parallel", "1", "--ops", "small-read", "--runtime", "1s"])
        .args(["--size", "1M", "--out"])
        .arg(out.path().join("results"))
        .env("DROVE_CA", &junk)
        .env("DROVE_TOKEN_FILE", &junk)
        .env("DROVE_TOKEN", "drove_not-this-clusters")
        .env("DROVE_CLUSTER", "127.0.0.1:1")
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "drove bench paper failed:\n{log}");
    let csv = std::fs::read_to_string(out.path().join("results/results.csv")).unwrap();
    assert!(rows(&csv).iter().any(|r| r["system"] == "drove"), "{csv}");
}

/// `drove bench meta`, small: every operation is measured against the leader and a
/// follower, none fails, and the list of a filled table is timed. Throughput is not
/// judged here (see bench/results/). The VDIs each level made are gone after it.
#[test]
fn test_bench_meta_small_run_measures_every_operation_without_failures() {
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_drove"))
        .args([
            "--json",
            "bench",
            "meta",
            "--count",
            "24",
            "--inflight",
            "1,8",
        ])
        .args(["--list-vdis", "150", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "drove bench meta failed:\n{log}");
    let printed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(printed["measurements"], file, "{log}");
    let rows = file.as_array().unwrap();
    let find = |target: &str, op: &str, n: u64| {
        rows.iter()
            .find(|r| r["target"] == target && r["op"] == op && r["inflight"] == n)
            .unwrap_or_else(|| panic!("no {target} {op} x{n} in {file}"))
    };
    for target in ["leader", "follower"] {
        for n in [1, 8] {
            for op in [
                "create", "snapshot", "clone", "lock", "attach", "delete", "list",
            ] {
                let r = find(target, op, n);
                assert_eq!(r["failed"], 0, "{r}");
                assert_eq!(r["count"], 24, "{r}");
                assert!(r["per_second"].as_f64().unwrap() > 0.0, "{r}");
                assert!(r["p50_ms"].as_f64().unwrap() > 0.0, "{r}");
            }
        }
    }
    let big: Vec<_> = rows
        .iter()
        .filter(|r| r["op"].as_str().unwrap().starts_with("list") && r["op"] != "list")
        .collect();
    assert_eq!(big.len(), 2, "{file}");
    for r in big {
        let n: usize = r["op"].as_str().unwrap()["list".len()..].parse().unwrap();
        assert_eq!(n, 150, "{r}");
        assert_eq!(r["failed"], 0, "{r}");
    }
    // The table was empty before the fill: every level deleted what it made.
    assert!(
        log.contains("list10k: creating 150 VDIs to have 150"),
        "{log}"
    );
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(md.contains("| leader | lock | 8 |"), "{md}");
}
