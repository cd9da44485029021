//! A QD1 writer of 4 KiB FUA blocks over libnbd (python3-libnbd), for the tests
//! that measure how long a failure stops writes, a writer that logs every
//! acknowledgement (for what a lost zone may lose), and the JSON helpers they share.
use super::{require_ok, text, Cluster};
use serde_json::Value;
use std::process::{Child, Command, Stdio};

/// The Python that has the `nbd` module (Debian's python3-libnbd).
pub const PY: &str = "/usr/bin/python3";

/// Writes 4 KiB blocks with FUA, one at a time, to NBD URI argv[1] for argv[2]
/// seconds (cycling over the first argv[3] blocks), or until the file argv[4] exists;
/// then prints one JSON line: writes, the first error (or null), the pauses longer
/// than 0.2 s as [start, end] unix times, and the first and last acknowledgement.
pub const WRITER: &str = r#"
import json, nbd, os, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
end = time.time() + float(sys.argv[2])
blocks = int(sys.argv[3])
stop = sys.argv[4]
n, err, gaps = 0, None, []
first = last = time.time()
while time.time() < end and not os.path.exists(stop):
    head = ("DROVE-SEQ %d\n" % n).encode()
    buf = head + bytes([n % 251]) * (4096 - len(head))
    try:
        h.pwrite(buf, (n % blocks) * 4096, nbd.CMD_FLAG_FUA)
    except Exception as e:
        err = "%.3f %s" % (time.time(), e)
        break
    now = time.time()
    if now - last > 0.2:
        gaps.append([last, now])
    last = now
    n += 1
print(json.dumps({"writes": n, "error": err, "gaps": gaps, "first": first, "last": last}), flush=True)
"#;

/// Whether python3-libnbd is there; under CI its absence fails the test.
#[track_caller]
pub fn have_libnbd() -> bool {
    let found = Command::new(PY)
        .args(["-c", "import nbd"])
        .status()
        .is_ok_and(|s| s.success());
    require_ok(if found {
        Ok(())
    } else {
        Err("python3-libnbd is not installed (scripts/install-deps.sh installs it)".to_string())
    })
    .is_some()
}

/// The JSON `drove ARGS` prints through node `i`; the command must succeed.
#[track_caller]
pub fn json_of(c: &Cluster, i: usize, args: &[&str]) -> Value {
    let o = c.drove(i, args);
    assert!(o.status.success(), "drove {args:?}: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

/// `cluster status --json` asked of node `i`.
#[track_caller]
pub fn status(c: &Cluster, i: usize) -> Value {
    json_of(c, i, &["cluster", "status", "--json"])
}

/// The node ids of a JSON array.
pub fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// The index in `c.nodes` of node `id`.
pub fn index(c: &Cluster, id: u64) -> usize {
    c.nodes.iter().position(|n| n.id == id).unwrap()
}

/// A writer of `WRITER` on `uri` for at most `secs` seconds; `stop` ends it early.
pub fn writer(uri: &str, secs: u32, stop: &std::path::Path) -> Child {
    Command::new(PY)
        .args(["-c", WRITER, uri, &secs.to_string(), "4096"])
        .arg(stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The writer's summary line.
pub fn summary(w: Child) -> Value {
    let o = w.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("writer said {out:?} ({e}): {}", text(&o)))
}

/// Seconds since the Unix epoch, as the writer's timestamps are.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The longest pause of a writer's summary (its gaps) that ends after `after`.
pub fn longest_pause(w: &Value, after: f64) -> f64 {
    w["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g[1].as_f64().unwrap() > after)
        .map(|g| g[1].as_f64().unwrap() - g[0].as_f64().unwrap())
        .fold(0.0, f64::max)
}

/// Writes 4 KiB blocks one at a time at 4 KiB * n for n = 0, 1, ... through NBD URI
/// argv[1], block n starting with "DROVE-SEQ n" and filled with byte n % 251; after
/// each acknowledgement prints "n unix-time". Ends at the first error or at argv[2]
/// blocks.
pub const ACK_WRITER: &str = r#"
import nbd, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for n in range(int(sys.argv[2])):
    head = ("DROVE-SEQ %d\n" % n).encode()
    buf = head + bytes([n % 251]) * (4096 - len(head))
    try:
        h.pwrite(buf, n * 4096)
    except Exception as e:
        print("error", e, flush=True)
        break
    print(n, time.time(), flush=True)
"#;

/// The block `ACK_WRITER` writes as number `n`.
pub fn block(n: u64) -> Vec<u8> {
    let head = format!("DROVE-SEQ {n}\n").into_bytes();
    let mut b = head.clone();
    b.resize(4096, (n % 251) as u8);
    b
}

/// The acknowledged blocks in a writer's output: (number, unix time of the ack).
pub fn acked(out: &str) -> Vec<(u64, f64)> {
    out.lines()
        .filter_map(|l| {
            let (n, t) = l.split_once(' ')?;
            Some((n.parse().ok()?, t.parse().ok()?))
        })
        .collect()
}
