//! End-to-end operator commands on a real 3-node cluster: streaming a VDI through a
//! pipe (`vdi export NAME -`, `vdi import - NAME --size`), `vdi rename` (refused while
//! a real qemu-io has the VDI open), `vdi list --filter`, the space views (`vdi du`,
//! `node df`, `cluster df`) against the bytes the nodes' stores really hold, and
//! errors as JSON on stdout under `--json`.
mod common;
use common::*;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what} failed: {}", text(&o));
    o
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

/// Run `script` in bash with pipefail (a pipeline fails when any part does), with
/// `$DROVE` and `$DROVE_CLUSTER` set, in `dir`.
fn sh(c: &Cluster, dir: &std::path::Path, script: &str) -> Output {
    run(Command::new("bash")
        .args(["-c", &format!("set -o pipefail; {script}")])
        .current_dir(dir)
        .env("DROVE", drove_bin())
        .env("DROVE_CLUSTER", &c.nodes[0].admin))
}

/// Bytes that are not all one value (so a lost or shifted block shows).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn test_a_vdi_streams_through_pipes_both_ways_and_bad_streams_leave_nothing() {
    if !require(&["nbdcopy", "qemu-img"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(5 * MIB + 12345, 7);
    std::fs::write(tmp.path().join("src.raw"), &data).unwrap();

    // In through a pipe (cat), out through a pipe (cat): the bytes come back, and
    // the rest of the 8 MiB VDI reads as zeros.
    let o = ok(
        sh(
            &c,
            tmp.path(),
            "cat src.raw | $DROVE vdi import - piped --size 8M --json",
        ),
        "import from stdin",
    );
    let s = json(&o);
    assert_eq!(s["op"], "import");
    assert_eq!(s["bytes"], data.len() as u64, "{s}");
    let o = ok(
        sh(&c, tmp.path(), "$DROVE vdi export piped - | cat > back.raw"),
        "export to stdout",
    );
    // The summary goes to stderr: stdout is the image.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Exported VDI 'piped' to '-'"),
        "{}",
        text(&o)
    );
    let back = std::fs::read(tmp.path().join("back.raw")).unwrap();
    assert_eq!(back.len(), 8 * MIB);
    assert!(back[..data.len()] == data[..], "streamed bytes differ");
    assert!(back[data.len()..].iter().all(|&b| b == 0));
    // Read through another node's NBD endpoint too: the data was replicated.
    let got = read_image(&c.nodes[2].uri("piped"), tmp.path(), data.len());
    assert!(got == data, "node 3 reads other bytes");
    // A reader that stops early (head) ends the export quietly, like cat.
    let o = sh(
        &c,
        tmp.path(),
        "$DROVE vdi export piped - | head -c 1000 | wc -c",
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1000");

    // More bytes than --size: refused, and the VDI made for it is deleted again.
    let o = sh(
        &c,
        tmp.path(),
        "cat src.raw | $DROVE vdi import - toolong --size 4M",
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("more than"), "{}", text(&o));
    assert!(text(&o).contains("deleted again"), "{}", text(&o));
    // No --size, or qcow2 asked for a stream: refused before anything is made.
    let o = sh(&c, tmp.path(), "cat src.raw | $DROVE vdi import - nosize");
    assert!(text(&o).contains("needs --size"), "{}", text(&o));
    let o = sh(
        &c,
        tmp.path(),
        "$DROVE vdi export piped - --format qcow2 | cat > /dev/null",
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("Only raw"), "{}", text(&o));
    assert_eq!(c.vdi_names(), vec!["piped".to_string()]);
    // Nothing named `-` was ever written.
    assert!(!tmp.path().join("-").exists());
}

#[test]
fn test_rename_filter_space_views_and_json_errors() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    for n in ["web-1", "web-2", "db-1"] {
        c.create_vdi(n, "64M", &[]);
    }
    // Real data in db-1: 3 MiB, on each of its 3 copies.
    qemu_io(&c.nodes[0].uri("db-1"), &["write -P 0x5a 0 3M".to_string()]);

    // --filter takes a shell pattern; no match is not an error.
    let names = |o: &Output| -> Vec<String> {
        json(o)
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    };
    let o = ok(
        c.drove(0, &["vdi", "list", "--filter", "web-*", "--json"]),
        "list",
    );
    assert_eq!(names(&o), vec!["web-1", "web-2"]);
    let o = ok(c.drove(0, &["vdi", "list", "--filter", "x?"]), "list");
    assert!(text(&o).contains("No VDI matches 'x?'"), "{}", text(&o));
    let o = c.drove(0, &["vdi", "list", "--filter", "[", "--json"]);
    assert!(!o.status.success());

    // Space: db-1 holds 3 MiB per copy on 3 copies; the per-node and per-zone sums
    // equal what the stores report, and the copies cost 2x the data.
    let du = json(&ok(c.drove(0, &["vdi", "du", "db-1", "--json"]), "du"));
    let row = &du.as_array().unwrap()[0];
    assert_eq!(row["name"], "db-1");
    let per_copy = row["per_copy_bytes"].as_u64().unwrap();
    let all = row["allocated_bytes"].as_u64().unwrap();
    assert!(
        per_copy >= 3 * MIB as u64 && per_copy < 4 * MIB as u64,
        "{row}"
    );
    assert_eq!(all, 3 * per_copy, "{row}");
    let nodes = json(&ok(c.drove(1, &["node", "df", "--json"]), "node df"));
    let used: u64 = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            assert_eq!(n["answered"], true, "{n}");
            assert!(n["disk_bytes"].as_u64().unwrap() >= n["free_bytes"].as_u64().unwrap());
            n["used_bytes"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(used, all, "{nodes}");
    let df = json(&ok(c.drove(2, &["cluster", "df", "--json"]), "cluster df"));
    assert_eq!(df["raw_bytes"].as_u64().unwrap(), all, "{df}");
    assert_eq!(df["data_bytes"].as_u64().unwrap(), per_copy, "{df}");
    assert_eq!(df["copies_cost_bytes"].as_u64().unwrap(), 2 * per_copy);
    assert_eq!(df["zones"].as_array().unwrap().len(), 3, "{df}");
    assert_eq!(
        df["provisioned_bytes"].as_u64().unwrap(),
        3 * 64 * MIB as u64
    );

    // Rename is refused while a client has the VDI open (a qemu-io that waits for
    // commands on its stdin), and works once it has gone.
    let mut holder = Command::new("qemu-io")
        .args(["-f", "raw", &c.nodes[1].uri("web-1")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = holder.stdin.take().unwrap();
    writeln!(stdin, "write -P 1 0 4k").unwrap();
    wait_until(Duration::from_secs(30), "web-1 to have a client", || {
        let s = json(&c.drove(0, &["vdi", "status", "web-1", "--json"]));
        !s["clients"].as_array().unwrap().is_empty()
    });
    let o = c.drove(0, &["vdi", "rename", "web-1", "web-9"]);
    assert!(!o.status.success(), "renamed while open: {}", text(&o));
    assert!(text(&o).contains("open"), "{}", text(&o));
    drop(stdin);
    holder.wait().unwrap();
    // Its lock may take a moment to go after the client leaves.
    wait_until(Duration::from_secs(30), "the rename to succeed", || {
        c.drove(0, &["vdi", "rename", "web-1", "web-9"])
            .status
            .success()
    });
    let o = ok(c.drove(2, &["vdi", "list", "--json"]), "list");
    assert_eq!(names(&o), vec!["db-1", "web-2", "web-9"]);
    // The data moved with the name: the new export reads what was written.
    let out = qemu_io(&c.nodes[2].uri("web-9"), &["read -P 1 0 4k".to_string()]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // A taken name or a bad one is refused and changes nothing.
    let o = c.drove(0, &["vdi", "rename", "web-9", "db-1", "--json"]);
    assert!(!o.status.success());
    let e = json(&o);
    assert_eq!(e["error"]["kind"], "already_exists", "{e}");
    let o = c.drove(0, &["vdi", "rename", "web-9", "bad/name"]);
    assert!(!o.status.success());
    let o = ok(c.drove(0, &["vdi", "list", "--json"]), "list");
    assert_eq!(names(&o), vec!["db-1", "web-2", "web-9"]);

    // Errors under --json: one JSON object on stdout with the node's error kind,
    // and a non-zero exit.
    let o = c.drove(0, &["vdi", "info", "nosuch", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let e = json(&o);
    assert_eq!(e["error"]["kind"], "not_found", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("No VDI named 'nosuch'"),
        "{e}"
    );
}
