//! WAN mode with real node processes: home zones (placement), and reads that stay in
//! the reader's zone.
mod common;
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// How many object data files of VDI `id` each node stores (`DIR/store/objects/<id %08x>/`).
fn objects_per_node(c: &Cluster, id: u64) -> BTreeMap<u64, usize> {
    c.nodes
        .iter()
        .map(|n| {
            let dir = Path::new(&n.data).join(format!("store/objects/{id:08x}"));
            let mut count = 0;
            if let Ok(groups) = std::fs::read_dir(&dir) {
                for g in groups.flatten() {
                    for f in std::fs::read_dir(g.path()).into_iter().flatten().flatten() {
                        if f.path().extension().is_none() {
                            count += 1;
                        }
                    }
                }
            }
            (n.id, count)
        })
        .collect()
}

fn info(c: &Cluster, name: &str) -> Value {
    let o = c.drove(0, &["vdi", "info", name, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// POST `body` to `path` on admin address `addr` over a bare socket: the whole
/// answer, status line included.
fn post_raw(addr: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// A sample of a counter in Prometheus text (0 when absent).
fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Four nodes in two zones, copies 3, no home zone given: the first writer's zone
/// becomes the home, both of its nodes hold every object and the other zone one
/// copy of each; a reader in the home zone reads its own copy.
#[test]
fn test_the_first_writers_zone_becomes_home_and_holds_two_copies() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(4, 2);
    c.create_vdi("w", "64M", &["--copies", "3"]);
    assert_eq!(info(&c, "w")["home_zone"], Value::Null);
    let writer = c.nodes[1].clone();
    let out = qemu_io(&writer.uri("w"), &["write -P 0x7e 0 16M".into()]);
    assert!(out.contains("wrote 16777216/16777216"), "{out}");
    let v = info(&c, "w");
    assert_eq!(v["home_zone"].as_str(), Some(writer.zone.as_str()), "{v}");
    let id = v["id"].as_u64().unwrap();

    let held = objects_per_node(&c, id);
    let (home, away): (Vec<&Node>, Vec<&Node>) =
        c.nodes.iter().partition(|n| n.zone == writer.zone);
    assert_eq!(home.len(), 2);
    for n in &home {
        assert_eq!(
            held[&n.id], 4,
            "home node {} holds every object: {held:?}",
            n.id
        );
    }
    let elsewhere: usize = away.iter().map(|n| held[&n.id]).sum();
    assert_eq!(elsewhere, 4, "one copy of each object outside: {held:?}");

    // The other home-zone node reads its own copy.
    let reader = home.iter().find(|n| n.id != writer.id).unwrap();
    let i = c.nodes.iter().position(|n| n.id == reader.id).unwrap();
    let before = c.metrics(i);
    let out = qemu_io(&reader.uri("w"), &["read -P 0x7e 0 16M".into()]);
    assert!(out.contains("read 16777216/16777216"), "{out}");
    let after = c.metrics(i);
    let local = r#"drove_gateway_reads_total{where="local"}"#;
    let remote = r#"drove_gateway_reads_total{where="remote"}"#;
    assert!(
        counter(&after, local) - counter(&before, local) >= 4.0,
        "{after}"
    );
    assert_eq!(counter(&after, remote), counter(&before, remote), "{after}");

    let o = c.drove(0, &["vdi", "check", "w", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["identical"], v["objects"], "{v}");
}

/// `--home-zone` names a zone some node is in; anything else is refused, clearly.
#[test]
fn test_home_zone_given_at_create_must_exist() {
    let c = Cluster::start(2, 2);
    let o = c.drove(0, &["vdi", "create", "x", "16M", "--home-zone", "mars"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("No node is in zone 'mars'"), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    let zone = c.nodes[1].zone.clone();
    let o = c.drove(
        0,
        &[
            "vdi",
            "create",
            "x",
            "16M",
            "--home-zone",
            &zone,
            "--copies",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(info(&c, "x")["home_zone"].as_str(), Some(zone.as_str()));
    let o = c.drove(0, &["vdi", "info", "x"]);
    assert!(
        text(&o).contains(&format!("home zone:   {zone}")),
        "{}",
        text(&o)
    );
}

/// The write policy is chosen at create (`--policy`, `--max-lag`), shown by `vdi
/// info`, changed by `vdi set`; a bad value is refused in one clear line.
#[test]
fn test_write_policy_is_set_at_create_and_changed_by_vdi_set() {
    let c = Cluster::start(2, 2);
    let zone = c.nodes[0].zone.clone();
    c.create_vdi(
        "p",
        "16M",
        &[
            "--copies",
            "2",
            "--home-zone",
            &zone,
            "--policy",
            "zone-sync",
            "--max-lag",
            "2s",
        ],
    );
    let v = info(&c, "p");
    assert_eq!(v["policy"], "zone-sync", "{v}");
    assert_eq!(v["max_lag_ms"], 2000, "{v}");
    assert_eq!(v["max_lag_bytes"], Value::Null, "{v}");
    let o = c.drove(0, &["vdi", "info", "p"]);
    assert!(
        text(&o).contains("policy:      zone-sync (max lag 2 s, 256 MiB)"),
        "{}",
        text(&o)
    );

    let o = c.drove(1, &["vdi", "set", "p", "--policy", "sync"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("VDI 'p': policy sync"), "{}", text(&o));
    let v = info(&c, "p");
    assert_eq!(v["policy"], "sync", "{v}");
    assert_eq!(
        v["max_lag_ms"], 2000,
        "the bound stays for the next switch: {v}"
    );

    let o = c.drove(0, &["vdi", "set", "p", "--max-lag-bytes", "64M", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["max_lag_bytes"], 64 << 20, "{v}");
    // Back to the default bound, the other one kept.
    let o = c.drove(0, &["vdi", "set", "p", "--max-lag", "default"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = info(&c, "p");
    assert_eq!(v["max_lag_ms"], Value::Null, "{v}");
    assert_eq!(v["max_lag_bytes"], 64 << 20, "{v}");
    let answer = post_raw(
        &c.nodes[0].admin,
        "/api/vdis/p/policy",
        r#"{"max_lag_bytes":1048576,"reset_max_lag_bytes":true}"#,
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("reset to its default at once"), "{answer}");

    for args in [
        &["vdi", "set", "p", "--policy", "fast"][..],
        &["vdi", "create", "q", "16M", "--policy", "fast"][..],
    ] {
        let o = c.drove(0, args);
        assert!(!o.status.success(), "{args:?}");
        let t = text(&o);
        assert!(
            t.contains("Unknown write policy 'fast': use sync or zone-sync"),
            "{t}"
        );
        assert!(!t.contains("panicked"), "{t}");
    }
    // The node refuses a bad policy by itself too, with the API's error body.
    let answer = post_raw(
        &c.nodes[0].admin,
        "/api/vdis/p/policy",
        r#"{"policy":"fast"}"#,
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("Unknown write policy 'fast'"), "{answer}");
    assert_eq!(info(&c, "p")["policy"], "sync");
}

/// `drove vdi handover` to a node of another zone while nobody writes: the home
/// zone moves there at once (a new epoch), the objects follow in the background,
/// and reads through a third zone return the data all along: right after the move
/// (the new holders still copying) and after it.
#[test]
fn test_a_handover_to_another_zone_moves_the_home_and_the_data_stays_readable() {
    if !require(&["qemu-io"]) {
        return;
    }
    // Six nodes round-robin in three zones: 0 and 3 in z1, 1 and 4 in z2, 2 and 5 in z3.
    let c = Cluster::start(6, 3);
    // Slow copies, so that the reads below meet objects still being moved.
    let o = c.drove(0, &["cluster", "config", "--recovery-rate", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    c.create_vdi(
        "mv",
        "64M",
        &[
            "--copies",
            "3",
            "--policy",
            "zone-sync",
            "--home-zone",
            "z1",
        ],
    );
    let out = qemu_io(&c.nodes[0].uri("mv"), &["write -P 0x5a 0 48M".into()]);
    assert!(out.contains("wrote 50331648/50331648"), "{out}");
    let id = info(&c, "mv")["id"].as_u64().unwrap();
    let before = objects_per_node(&c, id);
    assert_eq!(
        (before[&c.nodes[0].id], before[&c.nodes[3].id]),
        (12, 12),
        "{before:?}"
    );

    let to = c.nodes[2].id.to_string();
    let o = c.drove(1, &["vdi", "handover", "mv", "--to", &to, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&r["home_zone_before"], &r["home_zone"]),
        (&Value::from("z1"), &Value::from("z3")),
        "{r}"
    );
    let v = info(&c, "mv");
    assert_eq!(v["home_zone"], "z3", "{v}");

    // Read through z2 at once, while z3's nodes are still copying.
    let read = qemu_io(&c.nodes[1].uri("mv"), &["read -P 0x5a 0 48M".into()]);
    assert!(read.contains("read 50331648/50331648"), "{read}");
    // The new home writes.
    let out = qemu_io(&c.nodes[2].uri("mv"), &["write -P 0x6b 8M 4M".into()]);
    assert!(out.contains("wrote 4194304/4194304"), "{out}");

    let mut held = BTreeMap::new();
    wait_until(
        std::time::Duration::from_secs(180),
        "the objects to reach z3",
        || {
            held = objects_per_node(&c, id);
            // Both z3 nodes hold every object, and the copies that moved away are
            // gone (an object's third copy may stay in z1: one per other zone).
            held[&c.nodes[2].id] == 12
                && held[&c.nodes[5].id] == 12
                && held.values().sum::<usize>() == 36
        },
    );
    eprintln!("objects per node after the move: {held:?}");
    for (off, len, pat) in [
        (0, 8 << 20, 0x5a),
        (8 << 20, 4 << 20, 0x6b),
        (12 << 20, 36 << 20, 0x5a),
    ] {
        let r = qemu_io(
            &c.nodes[1].uri("mv"),
            &[format!("read -P {pat} {off} {len}")],
        );
        assert!(r.contains(&format!("read {len}/{len}")), "{r}");
    }
    let o = c.drove(1, &["vdi", "check", "mv", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let check: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(check["identical"], check["objects"], "{check}");
}
