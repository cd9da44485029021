//! A replica that stops answering without closing its sockets (SIGSTOP: a hung host,
//! a paused VM, a cable cut on the far side) must not hold the VMs' writes: the
//! gateway gives it up after about a second of silence, has it marked down, and goes on
//! without it; after SIGCONT it comes back through the normal catch-up. And a busy
//! but healthy cluster marks nobody down (e2e_busy.rs, its own binary so that its
//! CPU hogs never run beside these timing tests).
mod common;
use common::*;
use serde_json::Value;
use std::process::Child;
use std::time::{Duration, Instant};

/// fio through `uri`: 4 KiB writes at `qd`, each followed by a FLUSH, paced so that
/// they last about 6 s, every block checked afterwards (crc32c), with a log of
/// every write's completion time.
fn fio(uri: &str, qd: usize, log: &std::path::Path) -> Child {
    paced_fio("silent", uri, qd)
        .arg(format!("--write_lat_log={}", log.display()))
        .arg("--log_avg_msec=0")
        .spawn()
        .expect("fio")
}

/// The longest time between two consecutive write completions in fio's latency
/// log (`time_ms, latency, direction, size, offset`; direction 1 is a write).
fn longest_pause(log: &std::path::Path) -> (Duration, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut times: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f.len() >= 3 && f[2] == "1")
                .then(|| f[0].parse().ok())
                .flatten()
        })
        .collect();
    times.sort_unstable();
    let gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    (Duration::from_millis(gap), times.len())
}

/// A node other than node 1 (the gateway of these tests) and the metadata leader.
fn replica_not_leader(c: &Cluster) -> Node {
    let leader = c.status()["leader"].as_u64().unwrap();
    c.nodes[1..]
        .iter()
        .find(|n| n.id != leader)
        .cloned()
        .expect("a replica that is not the metadata leader")
}

/// Stop a replica (not the gateway, not the metadata leader) with SIGSTOP for 4 s
/// under fio at `qd` through node 1; then check the pause, the mark-down and its
/// reason, the catch-up after SIGCONT and every acknowledged block.
fn stop_a_replica_under_writes(mode: &str, qd: usize) {
    let c = Cluster::start(3, 3);
    // A short hold-down keeps the test short; the default (60 s) is unit-tested.
    let o = c.drove(0, &["cluster", "config", "--hold-down", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    c.create_vdi("s", "64M", &["--copies", "3", "--mode", mode]);
    let victim = replica_not_leader(&c);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("w");
    let load = fio(&c.nodes[0].uri("s"), qd, &log);
    std::thread::sleep(Duration::from_secs(2));
    signal(victim.pid, Signal::STOP);
    let stopped = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    signal(victim.pid, Signal::CONT);
    fio_ok(load, &format!("{mode} QD{qd}"));
    assert!(stopped.elapsed() > Duration::from_secs(4));
    let (pause, writes) = longest_pause(&dir.path().join("w_lat.1.log"));
    eprintln!("{mode} QD{qd}: {writes} writes, longest pause between acknowledgements {pause:?}");
    assert!(writes > 1000, "fio wrote too little to judge: {writes}");
    let history = c.status()["epoch_history"].to_string();
    // Alone on this machine the pause is about the 1 s silence floor (1.01-1.02 s,
    // bench/results/silent-node.md), and the target is under 2 s. The suite runs two
    // tests at once on a machine that may be busy (2.23 s was seen beside two CPU
    // hogs), so the assertion is what tells the watchdog from no watchdog at all:
    // without it a write waits out the 10 s request timeout.
    assert!(
        pause < Duration::from_secs(5),
        "writes stalled for {pause:?} ({mode}, QD{qd}): {history}"
    );

    // Marked down by a gateway's timeout (with primary-copy, the primary's when the
    // stopped node is a secondary), and the history says who and why.
    let by = format!("node {} Up -> Down (by gateway node ", victim.id);
    assert!(history.contains(&by), "{history}");
    // The reason is the watchdog's ("said nothing for N ms") or, for a write sent after
    // the watchdog gave the node up, the fail-fast refusal ("went silent N ms ago").
    assert!(history.contains("silent"), "{history}");
    let metrics = c.metrics(0);
    assert!(
        metrics.contains(&format!(
            "drove_gateway_markdowns_total{{node=\"{}\",cause=\"silent\"}}",
            victim.id
        )),
        "{metrics}"
    );
    // Back after SIGCONT through the normal catch-up; every replica identical.
    wait_until(Duration::from_secs(60), "the stopped node back up", || {
        c.status()["map"]["nodes"][victim.id.to_string()]["state"] == "up"
    });
    // Down once, up once: no flapping.
    let history = c.status()["epoch_history"].to_string();
    let downs = history
        .matches(&format!("node {} Up -> Down", victim.id))
        .count();
    assert_eq!(downs, 1, "{history}");
    wait_until(Duration::from_secs(120), "recovery to finish", || {
        let o = c.drove(0, &["vdi", "check", "s", "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        v["identical"] == v["objects"] && v["degraded"] == 0 && v["objects"].as_u64() > Some(0)
    });
}

#[test]
fn test_sigstop_replica_direct_qd1_writes_pause_briefly() {
    if !require(&["fio"]) {
        return;
    }
    stop_a_replica_under_writes("direct", 1);
}

#[test]
fn test_sigstop_replica_direct_qd16_writes_pause_briefly() {
    if !require(&["fio"]) {
        return;
    }
    stop_a_replica_under_writes("direct", 16);
}

/// With three nodes and three copies, the stopped node is the primary of about a
/// third of the objects.
#[test]
fn test_sigstop_primary_of_primary_copy_vdi_writes_pause_briefly() {
    if !require(&["fio"]) {
        return;
    }
    stop_a_replica_under_writes("primary-copy", 1);
}

/// The count `name{peer="N"}` on node `i`'s metrics (0 when not there yet).
fn peer_count(c: &Cluster, i: usize, name: &str, peer: u64) -> u64 {
    let key = format!("{name}{{peer=\"{peer}\"}} ");
    c.metrics(i)
        .lines()
        .find_map(|l| l.strip_prefix(&key).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// A replica silent just past the 1 s silence floor (a scheduling hiccup, a
/// short cut) is not marked down: the gateway gives it up, pings it, finds it
/// answering again and sends the write again. The epoch stays where it was, no
/// recovery starts and fio sees no error.
#[test]
fn test_a_replica_silent_just_past_the_floor_is_spared_a_mark_down() {
    if !require(&["fio"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let o = c.drove(0, &["cluster", "config", "--hold-down", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    c.create_vdi("s", "64M", &["--copies", "3"]);
    let victim = replica_not_leader(&c);
    let dir = tempfile::tempdir().unwrap();
    // Stop it under fio, and let it go on as soon as the gateway gave it up as
    // silent: the gateway's ping (300 ms at least) then finds it answering. A
    // trial whose SIGCONT came too late for that (a busy machine) does not count:
    // the node is rightly marked down, comes back, and another trial goes.
    for trial in 0..3 {
        let epoch = c.status()["map"]["epoch"].as_u64().unwrap();
        let log = dir.path().join(format!("w{trial}"));
        let load = fio(&c.nodes[0].uri("s"), 1, &log);
        std::thread::sleep(Duration::from_secs(2));
        let silent0 = peer_count(&c, 0, "drove_peer_silences_total", victim.id);
        signal(victim.pid, Signal::STOP);
        let t0 = Instant::now();
        let mut seen = None;
        while t0.elapsed() < Duration::from_secs(4) {
            if peer_count(&c, 0, "drove_peer_silences_total", victim.id) > silent0 {
                seen = Some(Instant::now());
                break;
            }
        }
        signal(victim.pid, Signal::CONT);
        let late = seen.map(|s| s.elapsed());
        let stopped = t0.elapsed();
        let o = load.wait_with_output().unwrap();
        assert!(o.status.success(), "fio failed: {}", text(&o));
        let (pause, writes) = longest_pause(&dir.path().join(format!("w{trial}_lat.1.log")));
        eprintln!(
            "trial {trial}: stopped {stopped:?}, SIGCONT {late:?} after the give-up was seen; \
             {writes} writes, longest pause {pause:?}"
        );
        let s = c.status();
        if late.is_some_and(|l| l < Duration::from_millis(150)) {
            assert_eq!(
                s["map"]["epoch"].as_u64(),
                Some(epoch),
                "a node silent just past the floor was marked down: {}",
                s["epoch_history"]
            );
            assert!(
                peer_count(&c, 0, "drove_gateway_spared_total", victim.id) >= 1,
                "{}",
                c.metrics(0)
            );
            return;
        }
        wait_until(Duration::from_secs(60), "the stopped node back up", || {
            c.status()["map"]["nodes"][victim.id.to_string()]["state"] == "up"
        });
    }
    panic!("no trial let the node go on within 150 ms of its give-up");
}
