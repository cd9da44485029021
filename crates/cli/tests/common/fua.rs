//! A QD1 writer of 4 KiB FUA blocks over libnbd (python3-libnbd), for the tests
//! that measure how long a failure stops writes, and the JSON helpers they share.
use super::{require_ok, text, Cluster};
use serde_json::Value;
use std::process::Command;

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
