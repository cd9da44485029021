//! How long writes through a surviving node pause when another node fails: the
//! metadata leader or a plain replica killed (SIGKILL), stopped (SIGSTOP) or cut
//! off with its zone, at QD1 and QD16, direct and primary-copy.
//! A write that skipped a failed replica is acknowledged only once the replica's
//! mark-down is committed, so losing the metadata leader costs an election on top
//! (docs/self-healing.md, "Losing the metadata leader").
//!
//! `test_killing_the_metadata_leader_pauses_writes_briefly` runs in `make test`. The
//! table of bench/results/pause-table-2026-11-27.md comes from the ignored bench:
//! `cargo test --release -p drove --test e2e_pause -- --ignored --nocapture bench_pause`
//! (`DROVE_PAUSE_RUNS` runs of each fault and load, 3 by default; the zone cuts run
//! each node in its own network namespace and need root).
mod common;
use common::fua::*;
use common::netns::{self, NetCluster};
use common::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Writes 4 KiB blocks with FUA, argv[3] at a time (the queue depth), to NBD URI
/// argv[1] for argv[2] seconds or until the file argv[4] exists; then prints one
/// JSON line: writes acknowledged, the first error (or null), the pauses longer than
/// 50 ms between two acknowledgements as [start, end] unix times, and the last one.
const GAP_WRITER: &str = r#"
import json, nbd, os, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
end = time.time() + float(sys.argv[2])
qd = int(sys.argv[3])
stop = sys.argv[4]
n, done, err, gaps = 0, 0, None, []
last = time.time()
flying = {}
while True:
    if err is None and time.time() < end and not os.path.exists(stop):
        while len(flying) < qd:
            head = ("DROVE-SEQ %d\n" % n).encode()
            buf = nbd.Buffer.from_bytearray(bytearray(head.ljust(4096, b".")))
            flying[h.aio_pwrite(buf, (n % 4096) * 4096, flags=nbd.CMD_FLAG_FUA)] = buf
            n += 1
    elif not flying:
        break
    h.poll(-1)
    for c in list(flying):
        try:
            if not h.aio_command_completed(c):
                continue
        except Exception as e:
            err = err or "%.3f %s" % (time.time(), e)
        del flying[c]
        now = time.time()
        if now - last > 0.05:
            gaps.append([last, now])
        last = now
        done += 1
print(json.dumps({"writes": done, "error": err, "gaps": gaps, "last": last}), flush=True)
"#;

/// The failure a run injects, 3 s into the writes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// SIGKILL of the metadata leader (which holds a replica).
    LeaderKill,
    /// SIGSTOP of the metadata leader for 4 s, then SIGCONT.
    LeaderStop,
    /// SIGKILL of a replica that is neither the gateway nor the metadata leader.
    ReplicaKill,
    /// SIGSTOP of that replica for 4 s, then SIGCONT.
    ReplicaStop,
    /// That replica's zone (its network namespace) cut off for 4 s, then healed.
    ReplicaCut,
    /// The metadata leader's zone cut off for 4 s, then healed.
    LeaderCut,
}

impl Fault {
    const ALL: [Fault; 6] = [
        Fault::LeaderKill,
        Fault::LeaderStop,
        Fault::LeaderCut,
        Fault::ReplicaKill,
        Fault::ReplicaStop,
        Fault::ReplicaCut,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::LeaderKill => "leader SIGKILL",
            Fault::LeaderStop => "leader SIGSTOP 4 s",
            Fault::ReplicaKill => "replica SIGKILL",
            Fault::ReplicaStop => "replica SIGSTOP 4 s",
            Fault::ReplicaCut => "replica's zone cut 4 s",
            Fault::LeaderCut => "leader's zone cut 4 s",
        }
    }

    fn on_leader(self) -> bool {
        matches!(
            self,
            Fault::LeaderKill | Fault::LeaderStop | Fault::LeaderCut
        )
    }

    fn is_cut(self) -> bool {
        matches!(self, Fault::ReplicaCut | Fault::LeaderCut)
    }
}

/// The writes of a run: queue depth and the VDI's replication mode.
#[derive(Clone, Copy, Debug)]
struct Load {
    qd: usize,
    mode: &'static str,
}

impl Load {
    const QD1: Load = Load {
        qd: 1,
        mode: "direct",
    };

    fn name(self) -> String {
        format!("QD{} {}", self.qd, self.mode)
    }
}

/// Wait until `status` (node `i`'s `cluster status --json`) shows 3 metadata voters
/// and a leader (joiners come in as learners).
fn wait_voters(status: impl Fn() -> Value) {
    wait_until(Duration::from_secs(60), "3 metadata voters", || {
        let v = status();
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
/// after the fault, the metadata term and the map's epoch before and after.
struct Seen {
    pause: f64,
    writes: u64,
    terms: (u64, u64),
    epochs: (u64, u64),
}

/// The indexes of the gateway (not the metadata leader) and of the victim of `fault`
/// among 3 nodes whose ids are `ids`.
fn roles(ids: &[u64], leader: u64, fault: Fault) -> (usize, usize) {
    let idx = |id: u64| ids.iter().position(|&n| n == id).unwrap();
    let gw = (0..ids.len()).find(|&i| ids[i] != leader).unwrap();
    let victim = if fault.on_leader() {
        idx(leader)
    } else {
        (0..ids.len())
            .find(|&i| i != gw && ids[i] != leader)
            .unwrap()
    };
    (gw, victim)
}

fn writer(uri: &str, qd: usize, stop: &std::path::Path) -> Child {
    Command::new(PY)
        .args(["-c", GAP_WRITER, uri, "11", &qd.to_string()])
        .arg(stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The writer's verdict on a run whose fault came at unix time `at`: no write
/// failed, writes went on after the fault, and the longest pause ending after it.
fn judge(what: &str, sum: &Value, at: f64) -> (f64, u64) {
    assert!(sum["error"].is_null(), "{what}: a write failed: {sum}");
    let last = sum["last"].as_f64().unwrap();
    assert!(last > at + 3.0, "{what}: writes did not go on: {sum}");
    let pause = sum["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g[1].as_f64().unwrap() > at)
        .map(|g| g[1].as_f64().unwrap() - g[0].as_f64().unwrap())
        .fold(0.0, f64::max);
    (pause, sum["writes"].as_u64().unwrap_or(0))
}

fn term_epoch(s: &Value) -> (u64, u64) {
    (
        s["term"].as_u64().unwrap_or(0),
        s["map"]["epoch"].as_u64().unwrap_or(0),
    )
}

/// A 3-node cluster in 3 zones, one 3-copy VDI written with `load` through a node
/// that is not the metadata leader; `fault` 3 s into the writes.
fn run(fault: Fault, load: Load) -> Seen {
    if fault.is_cut() {
        return run_cut(fault, load);
    }
    let c = Cluster::start(3, 3);
    wait_voters(|| status(&c, 0));
    let s = status(&c, 0);
    let ids: Vec<u64> = c.nodes.iter().map(|n| n.id).collect();
    let (gw, victim) = roles(&ids, s["leader"].as_u64().unwrap(), fault);
    c.create_vdi("p", "64M", &["--copies", "3", "--mode", load.mode]);
    let before = term_epoch(&status(&c, gw));
    let dir = tempfile::tempdir().unwrap();
    let w = writer(&c.nodes[gw].uri("p"), load.qd, &dir.path().join("stop"));
    std::thread::sleep(Duration::from_secs(3));
    let pid = c.nodes[victim].pid;
    let at = unix_now();
    match fault {
        Fault::LeaderKill | Fault::ReplicaKill => signal(pid, Signal::KILL),
        _ => {
            signal(pid, Signal::STOP);
            std::thread::sleep(Duration::from_secs(4));
            signal(pid, Signal::CONT);
        }
    }
    let (pause, writes) = judge(fault.name(), &summary(w), at);
    let after = term_epoch(&status(&c, gw));
    Seen {
        pause,
        writes,
        terms: (before.0, after.0),
        epochs: (before.1, after.1),
    }
}

/// As [`run`], each node in its own network namespace, the victim's cut off.
fn run_cut(fault: Fault, load: Load) -> Seen {
    let c = NetCluster::start(3, &[]);
    let st = |i: usize| -> Value {
        let o = c.drove(i, &["cluster", "status", "--json"]);
        serde_json::from_slice(&o.stdout).unwrap_or_default()
    };
    wait_voters(|| st(0));
    let ids: Vec<u64> = c.nodes.iter().map(|n| n.id).collect();
    let (gw, victim) = roles(&ids, st(0)["leader"].as_u64().unwrap(), fault);
    let o = c.drove(
        gw,
        &[
            "vdi", "create", "p", "64M", "--copies", "3", "--mode", load.mode,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let before = term_epoch(&st(gw));
    let dir = tempfile::tempdir().unwrap();
    let w = writer(&c.nodes[gw].uri("p"), load.qd, &dir.path().join("stop"));
    std::thread::sleep(Duration::from_secs(3));
    let at = unix_now();
    c.cut(victim);
    std::thread::sleep(Duration::from_secs(4));
    c.heal(victim);
    let (pause, writes) = judge(fault.name(), &summary(w), at);
    let after = term_epoch(&st(gw));
    Seen {
        pause,
        writes,
        terms: (before.0, after.0),
        epochs: (before.1, after.1),
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
    let seen = run(Fault::LeaderKill, Load::QD1);
    eprintln!(
        "leader SIGKILL: {} writes, longest pause after the kill {:.3} s, terms {:?}",
        seen.writes, seen.pause, seen.terms
    );
    assert!(seen.pause < 2.5, "writes paused {:.3} s", seen.pause);
}

/// The table of bench/results/pause-table-2026-11-27.md: every fault under every load,
/// `DROVE_PAUSE_RUNS` runs each (3 by default); `DROVE_PAUSE_ONLY` keeps the rows
/// whose name contains it (e.g. "SIGKILL" or "QD16"). The zone cuts need root.
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
    let only = std::env::var("DROVE_PAUSE_ONLY").unwrap_or_default();
    let loads = [
        Load::QD1,
        Load {
            qd: 16,
            mode: "direct",
        },
        Load {
            qd: 1,
            mode: "primary-copy",
        },
        Load {
            qd: 16,
            mode: "primary-copy",
        },
    ];
    let mut rows = Vec::new();
    for fault in Fault::ALL {
        for load in loads {
            let row = format!("{} | {}", fault.name(), load.name());
            if !row.contains(&only) {
                continue;
            }
            if fault.is_cut() && netns::needs_root().is_some() {
                eprintln!("{row}: skipped, network namespaces need root");
                continue;
            }
            let seen: Vec<Seen> = (0..runs).map(|_| run(fault, load)).collect();
            let pauses: Vec<String> = seen.iter().map(|s| format!("{:.2}", s.pause)).collect();
            let writes: u64 = seen.iter().map(|s| s.writes).sum::<u64>() / runs.max(1) as u64;
            let moves = |f: fn(&Seen) -> (u64, u64)| {
                seen.iter()
                    .map(|s| f(s).1.saturating_sub(f(s).0).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let max = seen.iter().map(|s| s.pause).fold(0.0, f64::max);
            rows.push(format!(
                "| {row} | {writes} | {} | {max:.2} | {} | {} |",
                pauses.join(", "),
                moves(|s| s.terms),
                moves(|s| s.epochs)
            ));
            eprintln!("{}", rows.last().unwrap());
        }
    }
    println!("| fault | load | writes per run | longest ack gap per run (s) | worst (s) | term moves | epoch moves |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
