//! The single-writer lock with real clients: a VDI written through one node refuses
//! a writer on another node (reads still work), until a hand-over moves the lock;
//! after that the old client's writes are refused.
mod common;
use common::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

fn try_qemu_io(uri: &str, cmd: &str) -> String {
    text(&run(
        Command::new("qemu-io").args(["-f", "raw", "-c", cmd, uri])
    ))
}

/// Whether 64 KiB at `at` of `uri` read back as `pattern` (a read that failed, or
/// could not even open the export, is no).
fn reads_back(uri: &str, pattern: &str, at: &str) -> bool {
    let t = try_qemu_io(uri, &format!("read -P {pattern} {at} 64k"));
    t.contains("read 65536/65536") && !t.contains("Pattern verification failed")
}

/// A qemu-io session that stays attached to `uri`, fed commands through stdin.
fn session(uri: &str) -> (std::process::Child, std::process::ChildStdin) {
    let mut child = Command::new("qemu-io")
        .args(["-f", "raw", uri])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-io");
    let stdin = child.stdin.take().unwrap();
    (child, stdin)
}

/// Client A: a qemu-io session on node 1 of `c` that stays attached, fed through
/// stdin, after it wrote 0x11 at `at` (64 KiB) and that write is readable on node 2.
fn attached_writer(c: &Cluster, at: &str) -> (std::process::Child, std::process::ChildStdin) {
    let (a, mut a_in) = session(&c.nodes[0].uri("vm"));
    writeln!(a_in, "write -P 0x11 {at} 64k").unwrap();
    writeln!(a_in, "flush").unwrap();
    a_in.flush().unwrap();
    let uri2 = c.nodes[1].uri("vm");
    wait_until(Duration::from_secs(10), "client A's write to land", || {
        reads_back(&uri2, "0x11", at)
    });
    (a, a_in)
}

/// Send client A one more command, end it, and return all it printed.
fn last_words(a: std::process::Child, mut a_in: std::process::ChildStdin, cmd: &str) -> String {
    writeln!(a_in, "{cmd}").unwrap();
    writeln!(a_in, "quit").unwrap();
    drop(a_in);
    let out = a.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn test_second_writer_is_refused_until_handover_then_old_writer_is_refused() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(2, 2);
    c.create_vdi("vm", "64M", &["--copies", "2"]);
    let uri1 = c.nodes[0].uri("vm");
    let uri2 = c.nodes[1].uri("vm");

    let (a, a_in) = attached_writer(&c, "0");
    let o = c.drove(1, &["vdi", "info", "vm", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["lock"]["owner"].as_u64(), Some(c.nodes[0].id), "{v}");
    let generation = v["lock"]["generation"].as_u64().unwrap();

    // Client B on node 2: reads work, writes are refused with a clear errno.
    let t = try_qemu_io(&uri2, "write -P 0x22 0 64k");
    assert!(
        t.contains("Operation not permitted"),
        "second writer must be refused: {t}"
    );
    assert!(!try_qemu_io(&uri2, "read -P 0x11 0 64k").contains("failed"));

    // Hand the lock to node 2: node 1 flushes and releases. A client on node 2 that
    // stays attached (so node 2 keeps the lock) can now write.
    let o = c.drove(
        1,
        &["vdi", "handover", "vm", "--to", &c.nodes[1].id.to_string()],
    );
    assert!(o.status.success(), "{}", text(&o));
    let (b, mut b_in) = session(&uri2);
    writeln!(b_in, "write -P 0x22 0 64k").unwrap();
    writeln!(b_in, "flush").unwrap();
    b_in.flush().unwrap();
    wait_until(Duration::from_secs(10), "node 2 to hold the lock", || {
        let o = c.drove(0, &["vdi", "info", "vm", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["lock"]["owner"].as_u64() == Some(c.nodes[1].id)
            && v["lock"]["generation"].as_u64().unwrap_or(0) > generation
    });
    wait_until(Duration::from_secs(10), "client B's write to land", || {
        reads_back(&uri1, "0x22", "0")
    });

    // Client A, still attached to node 1, can no longer write; B's data stands.
    let t = last_words(a, a_in, "write -P 0x33 0 64k");
    assert!(
        t.contains("Operation not permitted"),
        "old writer must be refused: {t}"
    );
    qemu_io(&uri1, &["read -P 0x22 0 64k".into()]);
    writeln!(b_in, "quit").unwrap();
    drop(b_in);
    let out = b.wait_with_output().unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("wrote 65536/65536"), "client B wrote: {t}");
}

/// `drove vdi lock break`: the holder's client stays attached, yet a writer on
/// another node gets the lock at once (no waiting out the lease), the old client's
/// later writes are refused, and what it wrote before the break stands.
#[test]
fn test_lock_break_fences_the_holder_and_frees_the_lock_at_once() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(2, 2);
    c.create_vdi("vm", "64M", &["--copies", "2"]);
    let uri2 = c.nodes[1].uri("vm");
    let (a, a_in) = attached_writer(&c, "1M");
    wait_until(Duration::from_secs(10), "client A to hold the lock", || {
        let o = c.drove(1, &["vdi", "info", "vm", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["lock"]["owner"].as_u64() == Some(c.nodes[0].id)
    });
    let t = try_qemu_io(&uri2, "write -P 0x22 0 64k");
    assert!(
        t.contains("Operation not permitted"),
        "before the break: {t}"
    );

    let o = c.drove(1, &["vdi", "lock", "break", "vm", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["broken"]["owner"].as_u64(), Some(c.nodes[0].id), "{r}");
    let g = r["broken"]["generation"].as_u64().unwrap();
    assert_eq!(r["fenced_below"].as_u64(), Some(g + 1), "{r}");

    // At once, with client A still attached and its lease not over: B writes.
    let t = try_qemu_io(&uri2, "write -P 0x22 0 64k");
    assert!(t.contains("wrote 65536/65536"), "after the break: {t}");
    let o = c.drove(0, &["vdi", "info", "vm", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Generation g + 1 went to nobody; node 2 took a later one.
    assert!(v["lock_generation"].as_u64().unwrap() >= g + 2, "{v}");

    // A's next write is refused; B's data and A's earlier data stand.
    let t = last_words(a, a_in, "write -P 0x33 0 64k");
    assert!(t.contains("Operation not permitted"), "old writer: {t}");
    qemu_io(
        &uri2,
        &["read -P 0x22 0 64k".into(), "read -P 0x11 1M 64k".into()],
    );

    // Nobody holds it now (B detached): a second break says so and succeeds.
    let o = c.drove(1, &["vdi", "lock", "break", "vm"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(1, &["vdi", "lock", "break", "nope"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("No VDI named 'nope'"), "{}", text(&o));
}

/// Sum of the counters `drove_meta_commands` of `kind` with outcome ok in `metrics`.
fn commands_ok(metrics: &str, kind: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("drove_meta_commands")
                && l.contains(&format!("kind=\"{kind}\""))
                && l.contains("outcome=\"ok\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The position in `c.nodes` of the metadata leader, as node `asked` sees it.
fn leader_index(c: &Cluster, asked: usize) -> usize {
    let o = c.drove(asked, &["cluster", "status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let id = s["leader"]
        .as_u64()
        .unwrap_or_else(|| panic!("no leader: {}", text(&o)));
    c.nodes.iter().position(|n| n.id == id).unwrap()
}

/// A writer's lease is renewed with the leader without a log entry per renewal:
/// one lock grant, many renewals. Killing the metadata leader under the writer
/// does not end its lease (the next leader keeps every lock alive before it lets
/// anyone else take one): the writer writes on, a writer on another node is still
/// refused, and once the first detaches the second writes and reads both.
#[test]
fn test_renewals_need_no_log_entry_and_a_leader_kill_keeps_the_lease() {
    if !require(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(3, 3);
    c.create_vdi("vm", "64M", &[]);
    let leader = leader_index(&c, 0);
    let w = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    // The writer's node renews every 2 s (a third of a 6 s lease).
    c.kill(w);
    c.restart_with(w, &["--lock-lease", "6"]);
    wait_until(
        Duration::from_secs(30),
        "the restarted node to be up",
        || c.status()["map"]["nodes"][c.nodes[w].id.to_string()]["state"] == "up",
    );
    let leader = leader_index(&c, other);
    assert_ne!(leader, w, "the restarted follower took the leadership");
    let before = c.metrics(leader);

    let (a, mut a_in) = session(&c.nodes[w].uri("vm"));
    writeln!(a_in, "write -P 0x11 0 64k").unwrap();
    writeln!(a_in, "flush").unwrap();
    a_in.flush().unwrap();
    let uri_other = c.nodes[other].uri("vm");
    wait_until(Duration::from_secs(20), "the writer's data to land", || {
        reads_back(&uri_other, "0x11", "0")
    });
    // Three renewals at least, confirmed by the leader.
    wait_until(Duration::from_secs(30), "three lease renewals", || {
        commands_ok(&c.metrics(leader), "RenewLease") >= commands_ok(&before, "RenewLease") + 3
    });
    let after = c.metrics(leader);
    let grants = commands_ok(&after, "AcquireLock") - commands_ok(&before, "AcquireLock");
    let renewals = commands_ok(&after, "RenewLease") - commands_ok(&before, "RenewLease");
    eprintln!("lock grants {grants}, renewals {renewals} (no log entry each)");
    assert_eq!(grants, 1, "renewals were lock grants:\n{after}");

    // The leader dies under the writer.
    c.kill(leader);
    // Refused: EPERM once a leader answers, EIO while there is none.
    let t = try_qemu_io(&uri_other, "write -P 0x22 0 64k");
    assert!(
        !t.contains("wrote") && t.contains("write failed"),
        "a second writer got in after the leader died: {t}"
    );
    // The writer's lease is renewed through the next leader: well past its 6 s.
    wait_until(
        Duration::from_secs(60),
        "a renewal with the next leader",
        || {
            let l = leader_index(&c, other);
            l != leader && commands_ok(&c.metrics(l), "RenewLease") >= 2
        },
    );
    let t = try_qemu_io(&uri_other, "write -P 0x22 0 64k");
    assert!(
        t.contains("Operation not permitted"),
        "a second writer got in while the first renewed: {t}"
    );
    let t = last_words(a, a_in, "write -P 0x33 64k 64k\nflush");
    assert!(
        t.matches("wrote 65536/65536").count() == 2 && !t.contains("failed"),
        "the writer after the leader died: {t}"
    );
    // Detached: the other node writes at once and reads both writes.
    wait_until(Duration::from_secs(20), "the lock to be free", || {
        try_qemu_io(&uri_other, "write -P 0x22 128k 64k").contains("wrote 65536/65536")
    });
    qemu_io(
        &uri_other,
        &[
            "read -P 0x11 0 64k".into(),
            "read -P 0x33 64k 64k".into(),
            "read -P 0x22 128k 64k".into(),
        ],
    );
}

/// A whole cluster dies under a writer (every node SIGKILLed, a site's power cut)
/// and starts again. A client then attaching through another node than the
/// writer's must not be served before the dead writer's generation is settled
/// (its replicas made identical): the new Raft term extended every lease and the
/// writer's node answers pings again, but the run of it that held the lock is
/// gone. Before the fix the attach was served at once and `vdi info` still showed
/// the writer's generation unsettled.
#[test]
fn test_after_a_whole_cluster_restart_another_node_settles_before_it_serves() {
    if !require(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(3, 3);
    c.create_vdi("vm", "64M", &[]);
    let (mut a, a_in) = attached_writer(&c, "0");
    let info = |c: &Cluster| -> serde_json::Value {
        let o = c.drove(1, &["vdi", "info", "vm", "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let v = info(&c);
    assert_eq!(v["lock"]["owner"].as_u64(), Some(c.nodes[0].id), "{v}");
    let generation = v["lock"]["generation"].as_u64().unwrap();
    assert!(
        v["settled_generation"].as_u64().unwrap() < generation,
        "{v}"
    );
    for i in 0..3 {
        c.kill(i);
    }
    drop(a_in);
    let _ = a.kill();
    let _ = a.wait();
    c.restart_all();
    // A reader through node 2 (not the writer's node 1).
    let uri2 = c.nodes[1].uri("vm");
    wait_until(Duration::from_secs(60), "a read through node 2", || {
        reads_back(&uri2, "0x11", "0")
    });
    let v = info(&c);
    let settled = v["settled_generation"].as_u64().unwrap();
    assert!(
        settled >= generation,
        "node 2 served the VDI with the dead writer's generation {generation} unsettled: {v}"
    );
}
