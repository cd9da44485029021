//! How long writes through a surviving node pause when another node fails: the
//! metadata leader killed (SIGKILL) or stopped (SIGSTOP), or a plain replica killed.
//! A write that skipped a failed replica is acknowledged only once the replica's
//! mark-down is committed, so losing the metadata leader costs an election on top
//! (docs/self-healing.md, "Losing the metadata leader").
//!
//! `test_killing_the_metadata_leader_pauses_writes_briefly` runs in `make test`. The
//! table of bench/results/pause-2026-11-27.md comes from the ignored bench:
//! `cargo test --release -p drove --test e2e_pause -- --ignored --nocapture bench_pause`
//! (`DROVE_PAUSE_RUNS` runs of each fault, 3 by default).
mod common;
use common::fua::*;
use common::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Writes 4 KiB blocks with FUA, one at a time (QD1), to NBD URI argv[1] for
/// argv[2] seconds or until the file argv[3] exists; then prints one JSON line:
/// writes, the first error (or null), the pauses longer than 50 ms as [start, end]
/// unix times, and the last acknowledgement.
const GAP_WRITER: &str = r#"
import json, nbd, os, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
end = time.time() + float(sys.argv[2])
stop = sys.argv[3]
n, err, gaps = 0, None, []
last = time.time()
while time.time() < end and not os.path.exists(stop):
    buf = ("DROVE-SEQ %d\n" % n).encode().ljust(4096, b".")
    try:
        h.pwrite(buf, (n % 4096) * 4096, nbd.CMD_FLAG_FUA)
    except Exception as e:
        err = "%.3f %s" % (time.time(), e)
        break
    now = time.time()
    if now - last > 0.05:
        gaps.append([last, now])
    last = now
    n += 1
print(json.dumps({"writes": n, "error": err, "gaps": gaps, "last": last}), flush=True)
"#;

/// The failure a run injects.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL of the metadata leader (which holds a replica).
    LeaderKill,
    /// SIGSTOP of the metadata leader for 4 s, then SIGCONT.
    LeaderStop,
    /// SIGKILL of a replica that is neither the gateway nor the metadata leader.
    ReplicaKill,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::LeaderKill => "leader SIGKILL",
            Fault::LeaderStop => "leader SIGSTOP 4 s",
            Fault::ReplicaKill => "replica SIGKILL",
        }
    }
}

/// Wait until node `i` sees 3 metadata voters (joiners come in as learners).
fn wait_voters(c: &Cluster, i: usize) {
    wait_until(Duration::from_secs(60), "3 metadata voters", || {
        let o = c.drove(i, &["cluster", "status", "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["voters"].as_array().is_some_and(|a| a.len() == 3) && v["leader"].as_u64().is_some()
    });
}

/// The writer's summary line.
fn summary(w: Child) -> Value {
    let o = w.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("writer said {out:?} ({e}): {}", text(&o)))
}

/// What one run saw: the longest pause between two acknowledgements that ends
/// after the fault, and the metadata term before and after.
struct Seen {
    pause: f64,
    writes: u64,
    terms: (u64, u64),
}

/// A 3-node cluster in 3 zones, one 3-copy direct-mode VDI written at QD1 with FUA
/// through a node that is not the metadata leader; `fault` 3 s into the writes.
fn run(fault: Fault) -> Seen {
    let c = Cluster::start(3, 3);
    wait_voters(&c, 0);
    let s = json_of(&c, 0, &["cluster", "status", "--json"]);
    let leader = s["leader"].as_u64().unwrap();
    let term0 = s["term"].as_u64().unwrap_or(0);
    let idx = |id: u64| c.nodes.iter().position(|n| n.id == id).unwrap();
    let gw = (0..3).find(|&i| c.nodes[i].id != leader).unwrap();
    let victim = match fault {
        Fault::LeaderKill | Fault::LeaderStop => idx(leader),
        Fault::ReplicaKill => (0..3)
            .find(|&i| i != gw && c.nodes[i].id != leader)
            .unwrap(),
    };
    c.create_vdi("p", "64M", &["--copies", "3"]);
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let w = Command::new(PY)
        .args(["-c", GAP_WRITER, &c.nodes[gw].uri("p"), "11"])
        .arg(&stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let pid = c.nodes[victim].pid;
    let at = unix_now();
    match fault {
        Fault::LeaderKill | Fault::ReplicaKill => signal(pid, Signal::KILL),
        Fault::LeaderStop => {
            signal(pid, Signal::STOP);
            std::thread::sleep(Duration::from_secs(4));
            signal(pid, Signal::CONT);
        }
    }
    let sum = summary(w);
    assert!(
        sum["error"].is_null(),
        "{}: a write failed: {sum}",
        fault.name()
    );
    let last = sum["last"].as_f64().unwrap();
    assert!(
        last > at + 3.0,
        "{}: writes did not go on: {sum}",
        fault.name()
    );
    let pause = sum["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g[1].as_f64().unwrap() > at)
        .map(|g| g[1].as_f64().unwrap() - g[0].as_f64().unwrap())
        .fold(0.0, f64::max);
    let s = json_of(&c, gw, &["cluster", "status", "--json"]);
    Seen {
        pause,
        writes: sum["writes"].as_u64().unwrap_or(0),
        terms: (term0, s["term"].as_u64().unwrap_or(0)),
    }
}

/// SIGKILL of the metadata leader under QD1 writes through another node: the
/// writes pause for the election plus the failed replica's mark-down. Before the
/// election timeouts were shortened and the forwarding followed the new leader at
/// once, the pause was 4.6-6.6 s (bench/results/pause-2026-11-27.md); the bound is
/// well above today's figure so that a busy machine does not fail it.
#[test]
fn test_killing_the_metadata_leader_pauses_writes_briefly() {
    if !require(&["python3"]) || !have_libnbd() {
        return;
    }
    let seen = run(Fault::LeaderKill);
    eprintln!(
        "leader SIGKILL: {} writes, longest pause after the kill {:.3} s, terms {:?}",
        seen.writes, seen.pause, seen.terms
    );
    assert!(seen.pause < 2.5, "writes paused {:.3} s", seen.pause);
}

/// The table of bench/results/pause-2026-11-27.md.
#[test]
#[ignore]
fn bench_pause() {
    if !require(&["python3"]) || !have_libnbd() {
        return;
    }
    let runs: usize = std::env::var("DROVE_PAUSE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut rows = Vec::new();
    for fault in [Fault::LeaderKill, Fault::LeaderStop, Fault::ReplicaKill] {
        let seen: Vec<Seen> = (0..runs).map(|_| run(fault)).collect();
        let pauses: Vec<String> = seen.iter().map(|s| format!("{:.2}", s.pause)).collect();
        let terms: Vec<String> = seen
            .iter()
            .map(|s| format!("{}", s.terms.1.saturating_sub(s.terms.0)))
            .collect();
        let max = seen.iter().map(|s| s.pause).fold(0.0, f64::max);
        rows.push(format!(
            "| {} | QD1 direct | {} | {:.2} | {} |",
            fault.name(),
            pauses.join(", "),
            max,
            terms.join(", ")
        ));
        eprintln!("{}", rows.last().unwrap());
    }
    println!("| fault | load | longest ack gap per run (s) | worst (s) | term moves |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
