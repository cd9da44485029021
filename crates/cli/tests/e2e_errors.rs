//! Bad input gets a clear error and loses nothing: CLI mistakes, an unreachable
//! cluster, unknown exports, I/O past the end, and garbage sent to every port.
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

fn fails_with(o: &std::process::Output, needle: &str) {
    let t = text(o);
    assert!(!o.status.success(), "expected failure, got success: {t}");
    assert!(t.contains(needle), "expected '{needle}' in: {t}");
    assert!(!t.contains("panicked"), "panic: {t}");
}

#[test]
fn test_cli_errors_are_clear() {
    let c = Cluster::start(2, 2);
    fails_with(
        &c.drove(0, &["vdi", "create", "a", "12Q"]),
        "Bad size '12Q'",
    );
    fails_with(&c.drove(0, &["vdi", "create", "a", "0"]), "size");
    fails_with(
        &c.drove(0, &["vdi", "create", "bad/name", "1G"]),
        "Bad VDI name",
    );
    fails_with(
        &c.drove(0, &["vdi", "create", "a", "1G", "--copies", "9"]),
        "--copies",
    );
    fails_with(
        &c.drove(0, &["vdi", "create", "a", "1G", "--copies", "3"]),
        "2",
    );
    fails_with(
        &c.drove(0, &["vdi", "create", "a", "1G", "--mode", "fast"]),
        "Unknown replication mode",
    );
    let o = c.drove(0, &["vdi", "create", "a", "1G"]);
    assert!(o.status.success(), "{}", text(&o));
    fails_with(&c.drove(1, &["vdi", "create", "a", "1G"]), "already exists");
    fails_with(&c.drove(1, &["vdi", "info", "nope"]), "No VDI named 'nope'");
    fails_with(
        &c.drove(0, &["vdi", "delete", "nope"]),
        "No VDI named 'nope'",
    );
    fails_with(&c.drove(0, &["vdi", "resize", "a", "512M"]), "shrink");
    let o = c.drove(1, &["vdi", "resize", "a", "2G", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["size"].as_u64(), Some(2 << 30));
    let o = c.drove(0, &["vdi", "info", "a", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["copies"].as_u64(),
        Some(2),
        "default copies = min(3, nodes)"
    );
    let o = run(Command::new(drove_bin()).args(["vdi", "list", "--cluster", "127.0.0.1:1"]));
    fails_with(&o, "Cannot reach the cluster at 127.0.0.1:1");
}

#[test]
fn test_nbd_errors_unknown_export_and_past_the_end() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(1, 1);
    c.create_vdi("small", "1M", &["--copies", "1"]);
    let o = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read 0 4k",
        &c.nodes[0].uri("missing"),
    ]));
    let t = text(&o);
    assert!(
        !o.status.success() || t.contains("rror"),
        "unknown export must fail: {t}"
    );
    // qemu-io checks bounds itself, so send an out-of-range read with nbdsh if present.
    if require(&["nbdsh"]) {
        // nbdsh runs `python3` from PATH; Debian's python3-libnbd is for
        // /usr/bin/python3, not for another python3 earlier on PATH (pyenv).
        let o = run(Command::new("nbdsh").env("PATH", "/usr/bin:/bin").args([
            "-u", &c.nodes[0].uri("small"),
            "-c", "try:\n  h.pread(4096, (1<<20) - 1024)\n  print('NO ERROR')\nexcept nbd.Error as e:\n  print('ERR', e.errno)",
        ]));
        let t = text(&o);
        assert!(
            t.contains("ERR"),
            "read past the end must be an NBD error: {t}"
        );
    }
    qemu_io(
        &c.nodes[0].uri("small"),
        &["write -P 9 0 4k".into(), "read -P 9 0 4k".into()],
    );
}

fn send_garbage_tcp(addr: &str, payload: &[u8]) {
    if let Ok(mut s) = TcpStream::connect(addr) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(payload);
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
    }
}

#[test]
fn test_garbage_on_every_port_node_keeps_serving() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(2, 2);
    c.create_vdi("g", "16M", &["--copies", "2"]);
    qemu_io(
        &c.nodes[0].uri("g"),
        &["write -P 0x61 0 1M".into(), "flush".into()],
    );
    let mut junk: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0xff; 4096],
        b"DRV1\xff\xff\xff\xff\0\0\0\0".to_vec(),
        b"DRV1\0\0\0\x20\0\0\0\0garbagegarbagegarbagegarbage!!!!".to_vec(),
        b"NBDMAGIC\0\0\0\0\0\0\0\0\0\0\0\0".to_vec(),
        b"POST /api/vdis HTTP/1.1\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\n{{{{{".to_vec(),
        b"POST /raft/append HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz".to_vec(),
    ];
    let mut x: u32 = 7;
    for _ in 0..20 {
        let v: Vec<u8> = (0..1000)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (x >> 16) as u8
            })
            .collect();
        junk.push(v);
    }
    for n in &c.nodes {
        let nbd = n.nbd_tcp.trim_start_matches("nbd://").to_string();
        for j in &junk {
            send_garbage_tcp(&n.admin, j);
            send_garbage_tcp(&n.peer, j);
            send_garbage_tcp(&nbd, j);
            if let Ok(mut s) = UnixStream::connect(&n.nbd_unix) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.write_all(j);
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf);
            }
        }
    }
    // Half-open: connect and say nothing, while others are served.
    let _idle: Vec<TcpStream> = c
        .nodes
        .iter()
        .filter_map(|n| TcpStream::connect(&n.peer).ok())
        .collect();
    qemu_io(
        &c.nodes[1].uri("g"),
        &["read -P 0x61 0 1M".into(), "write -P 0x62 1M 1M".into()],
    );
    qemu_io(&c.nodes[0].uri("g"), &["read -P 0x62 1M 1M".into()]);
    let o = c.drove(1, &["cluster", "status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// The status line of one plain HTTP/1.1 request to `addr` (`""` when nothing
/// answered), and the body.
fn http(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> (String, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (String::new(), String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}Content-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(req.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.lines().next().unwrap_or("").to_string();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The metadata's internal routes (Raft, forwarded writes, joins, heartbeats) are
/// served on the peer port only: the public admin API answers 404 to every one of
/// them (before, a forged `/raft/vote` or `/meta/write` there was applied), and its
/// hello says where they are. On the peer port a call that does not name the cluster
/// is refused. The cluster works throughout, and a node still joins by the admin
/// address of a member.
#[test]
fn test_the_admin_api_serves_no_internal_route() {
    let c = Cluster::start(3, 1);
    let internal = [
        "/raft/append",
        "/raft/vote",
        "/raft/snapshot",
        "/meta/write",
        "/meta/write-batch",
        "/meta/read-index",
        "/meta/renew",
        "/meta/join",
        "/meta/remove",
        "/meta/heartbeat",
    ];
    for n in &c.nodes {
        for path in internal {
            let (status, body) = http(&n.admin, "POST", path, "", "{}");
            assert!(
                status.contains(" 404 "),
                "{path} on the admin API {}: {status} {body}",
                n.admin
            );
            // On the peer port the route exists, and refuses a caller that does not
            // name this cluster.
            let (status, body) = http(&n.peer, "POST", path, "", "{}");
            assert!(
                status.contains(" 403 ") && body.contains("Refused"),
                "{path} on the peer port {}: {status} {body}",
                n.peer
            );
        }
        let (status, body) = http(&n.admin, "GET", "/meta/hello", "", "");
        assert!(status.contains(" 200 "), "{status} {body}");
        let hello: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(hello["internal"], n.peer.as_str(), "{hello}");
    }
    // The cluster elected, joined and serves through the peer ports.
    c.create_vdi("i", "4M", &[]);
    let st = c.status();
    assert_eq!(st["map"]["nodes"].as_object().unwrap().len(), 3, "{st}");

    // The lock benchmark of `drove bench meta` locks only its own VDIs.
    let admin = &c.nodes[1].admin;
    for (body, says) in [
        (r#"{"vdis":["i"],"count":1}"#, "is not the benchmark's"),
        (r#"{"vdis":[],"count":1}"#, "Give 1 to 4096 VDIs"),
        (
            r#"{"vdis":["drove-bench-x"],"count":0}"#,
            "Give 1 to 10000000 cycles",
        ),
        (r#"{"vdis":["drove-bench-none"],"count":1}"#, "No VDI named"),
        (r#"{"vdis":"#, ""),
    ] {
        let (status, text) = http(admin, "POST", "/api/bench/locks", "", body);
        assert!(status.contains(" 4"), "{body}: {status} {text}");
        assert!(text.contains(says), "{body}: {status} {text}");
    }
    let o = c.drove(0, &["vdi", "info", "i", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Never locked, not even for a moment.
    assert_eq!(v["lock_generation"], 0, "{v}");
    assert_eq!(v["lock"], serde_json::Value::Null, "{v}");
}

/// A request id names one change: sent again with the same command it answers with
/// the first outcome, but with another command (a user reusing `--request-id`) it
/// is refused, where it once answered for the first command: `vdi create rq2`
/// printed rq1 and created nothing, `vdi delete pat` printed "Deleted" and left pat.
#[test]
fn test_a_request_id_reused_for_another_command_is_refused() {
    let c = Cluster::start(1, 1);
    c.create_vdi("pat", "1M", &[]);
    let id = "00000000000000000000000000000001";
    let o = c.drove(0, &["--request-id", id, "vdi", "create", "rq1", "1M"]);
    assert!(o.status.success(), "{}", text(&o));
    // The same command again: its first outcome, nothing more.
    let o = c.drove(
        0,
        &["--request-id", id, "vdi", "create", "rq1", "1M", "--json"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["name"], "rq1", "{v}");
    for args in [
        &["vdi", "create", "rq2", "1M"][..],
        &["vdi", "delete", "pat"][..],
    ] {
        let mut with_id = vec!["--request-id", id, "--json"];
        with_id.extend_from_slice(args);
        let o = c.drove(0, &with_id);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&o)));
        assert_eq!(v["error"]["kind"], "invalid", "{args:?}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("request id was used before for another command"),
            "{msg}"
        );
    }
    let mut names = c.vdi_names();
    names.sort();
    assert_eq!(names, ["pat", "rq1"]);
}

/// The `--json` error of `drove ARGS` on node 1: its kind and message.
fn json_error(c: &Cluster, args: &[&str]) -> (String, String) {
    let mut with = vec!["--json"];
    with.extend_from_slice(args);
    let o = c.drove(0, &with);
    assert!(!o.status.success(), "{args:?} succeeded: {}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&o)));
    let kind = v["error"]["kind"].as_str().unwrap_or_default().to_string();
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (kind, msg)
}

/// `1P` is a size (the limit message names it: "larger than the 1P limit").
#[test]
fn test_a_size_in_pebibytes_is_taken_up_to_the_limit() {
    let c = Cluster::start(1, 1);
    let o = c.drove(0, &["vdi", "create", "huge", "1P", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["size"].as_u64(), Some(1 << 50), "{v}");
    let (kind, msg) = json_error(&c, &["vdi", "create", "huger", "1.5P"]);
    assert_eq!(kind, "invalid");
    assert!(msg.contains("larger than the 1P limit"), "{msg}");
}

/// Names in error messages come out with control characters escaped and cut after
/// 64 characters, whoever refuses them (the node, the metadata, the CLI); once
/// they were echoed raw (a terminal ran the escape sequences) and whole.
#[test]
fn test_names_in_errors_are_escaped_and_cut() {
    let c = Cluster::start(1, 1);
    let red = "\u{1b}[31mred";
    let long = "x".repeat(300);
    for args in [
        vec!["vdi", "info", red],
        vec!["vdi", "create", red, "1M"],
        vec!["vdi", "delete", red],
        vec!["vdi", "du", red],
        vec!["token", "delete", red],
    ] {
        let o = c.drove(0, &args);
        assert!(!o.status.success(), "{args:?}: {}", text(&o));
        let t = text(&o);
        assert!(!t.contains('\u{1b}'), "{args:?} echoed the escape: {t:?}");
        assert!(t.contains("\\u{1b}[31mred"), "{args:?}: {t:?}");
    }
    for args in [
        vec!["vdi", "info", &long],
        vec!["vdi", "create", &long, "1M"],
        vec!["vdi", "du", &long],
    ] {
        let o = c.drove(0, &args);
        assert!(!o.status.success());
        let t = text(&o);
        assert!(
            !t.contains(&"x".repeat(65)),
            "{:?}: the whole name: {t}",
            &args[..2]
        );
        assert!(t.contains(&format!("{}…", "x".repeat(64))), "{t}");
    }
}

/// Under `--json`, errors the CLI finds itself have the kind the node would give
/// (they once all said `error`). A snapshot with clones was refused as `locked`
/// (which means another node writes the VDI); it is now deleted by name and kept
/// for its readers (e2e_lineage), and says so in its JSON.
#[test]
fn test_json_error_kinds_are_the_nodes_words() {
    let c = Cluster::start(1, 1);
    c.create_vdi("base", "1M", &[]);
    assert_eq!(json_error(&c, &["vdi", "create", "a", "12Q"]).0, "invalid");
    assert_eq!(
        json_error(&c, &["vdi", "create", "a", "1M", "--copies", "0"]).0,
        "invalid"
    );
    assert_eq!(json_error(&c, &["vdi", "du", "nope"]).0, "not_found");
    let o =
        run(Command::new(drove_bin()).args(["--json", "vdi", "list", "--cluster", "127.0.0.1:1"]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "unavailable", "{v}");
    let o = c.drove(0, &["vdi", "snapshot", "base", "golden"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(0, &["vdi", "clone", "golden", "web1"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(0, &["vdi", "delete", "golden", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kept_for"], serde_json::json!(["base", "web1"]), "{v}");
    assert_eq!(json_error(&c, &["vdi", "delete", "golden"]).0, "not_found");
}

/// VDI and node JSON keep every field: an unset optional value is `null`, an
/// empty list `[]` (lists were left out when empty, beside `null`s).
#[test]
fn test_vdi_and_node_json_write_every_field() {
    let c = Cluster::start(1, 1);
    c.create_vdi("v", "1M", &[]);
    let o = c.drove(0, &["vdi", "info", "v", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["home_zone"].is_null() && v.get("home_zone").is_some(),
        "{v}"
    );
    assert_eq!(v.get("nbd_clients"), Some(&serde_json::json!([])), "{v}");
    assert_eq!(v.get("past_homes"), Some(&serde_json::json!([])), "{v}");
    let o = c.drove(0, &["vdi", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0].get("nbd_clients"), Some(&serde_json::json!([])), "{v}");
}

/// A request body the admin API cannot parse is answered in its JSON error shape
/// (`{"error": "invalid", "message": ...}`), as every other refusal; it was axum's
/// plain text.
#[test]
fn test_a_bad_request_body_gets_the_json_error_shape() {
    let c = Cluster::start(1, 1);
    let admin = &c.nodes[0].admin;
    for (body, ctype) in [
        ("{", "application/json"),
        (r#"{"name": 5}"#, "application/json"),
        (r#"{"name": "a", "size": 1048576}"#, "text/plain"),
    ] {
        let o = run(Command::new("curl").args([
            "-s",
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
            "-H",
            &format!("Content-Type: {ctype}"),
            "--data-binary",
            body,
            &format!("http://{admin}/api/vdis"),
        ]));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let (json, code) = out.rsplit_once('\n').unwrap();
        assert!(code.starts_with('4'), "{body}: {out}");
        let v: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{body}: not JSON ({e}): {out}"));
        assert_eq!(v["error"], "invalid", "{body}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
}

/// A qcow2 whose refcount table is corrupt: qemu-img converts it with "Image is
/// corrupt" on stderr and exit 0; the import once hid that and succeeded. Now it
/// is refused with qemu-img's words, and the VDI it made is deleted again.
#[test]
fn test_importing_a_qcow2_with_a_corrupt_refcount_table_is_refused() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let c = Cluster::start(1, 1);
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("bad.qcow2");
    let img_s = img.to_str().unwrap();
    let o = run(Command::new("qemu-img").args(["create", "-q", "-f", "qcow2", img_s, "8M"]));
    assert!(o.status.success(), "{}", text(&o));
    let o = run(Command::new("qemu-io").args(["-f", "qcow2", "-c", "write -P 0x33 0 1M", img_s]));
    assert!(o.status.success(), "{}", text(&o));
    // The header's refcount_table_offset (bytes 48..56); its first entry, the
    // offset of the first refcount block, made unaligned.
    let mut b = std::fs::read(&img).unwrap();
    let table = u64::from_be_bytes(b[48..56].try_into().unwrap()) as usize;
    b[table..table + 8].copy_from_slice(&0x12345u64.to_be_bytes());
    std::fs::write(&img, &b).unwrap();
    let o = c.drove(0, &["vdi", "import", img_s, "bad"]);
    assert!(
        !o.status.success(),
        "a corrupt image was imported: {}",
        text(&o)
    );
    assert!(text(&o).contains("Image is corrupt"), "{}", text(&o));
    assert!(!c.vdi_names().contains(&"bad".to_string()));
}
