//! The admin API's JSON bodies against a bounded fuzz run: every route that takes
//! a body gets bodies made from its own field names with hostile values (wrong
//! types, huge and negative numbers, long and control-character strings, deep
//! nesting), mutated valid bodies, non-objects and random bytes, sent over real
//! HTTP to a real node. Every answer must be a status the API means to give (2xx,
//! 4xx, 503, 507: never a 500, never a connection closed without an answer, which
//! is what a panicking handler leaves), and every refusal (4xx) in the API's JSON
//! error shape; afterwards the node is alive, its memory
//! has not grown without bound, it logged no panic, and a VDI no route was pointed
//! at reads back as written.
//!
//! The run is seeded and bounded: `DROVE_FUZZ_SEED` (default 1) and
//! `DROVE_FUZZ_CASES` (bodies per route, default 40) make a longer one, e.g.
//! `DROVE_FUZZ_SEED=7 DROVE_FUZZ_CASES=2000 cargo test --release -p drove --test
//! e2e_fuzz_admin -- --nocapture`. A failure prints the seed, the route and the
//! body.
mod common;
use common::*;
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// xorshift64*: small, seeded, the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// A route that takes a JSON body: method, path (`{v}` is replaced by a VDI name),
/// its fields, and one body it accepts as well formed.
struct Route {
    method: &'static str,
    path: &'static str,
    fields: &'static [&'static str],
    valid: fn() -> Value,
}

/// The VDI that no path names: it must read back as written at the end.
const KEEP: &str = "keep";

fn routes() -> Vec<Route> {
    vec![
        Route {
            method: "POST",
            path: "/api/vdis",
            fields: &[
                "name",
                "size",
                "copies",
                "mode",
                "min_copies",
                "home_zone",
                "home_copies",
                "policy",
                "max_lag_ms",
                "max_lag_bytes",
            ],
            valid: || json!({"name": "fz-new", "size": 16 << 20, "copies": 1}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/resize",
            fields: &["size", "grow"],
            valid: || json!({"size": 32 << 20}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/rename",
            fields: &["to"],
            valid: || json!({"to": "fz-renamed"}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/lock/break",
            fields: &[],
            valid: || json!({}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/handover",
            fields: &["to"],
            valid: || json!({"to": 1}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/min-copies",
            fields: &["min_copies"],
            valid: || json!({"min_copies": 1}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/policy",
            fields: &[
                "policy",
                "max_lag_ms",
                "max_lag_bytes",
                "reset_max_lag_ms",
                "reset_max_lag_bytes",
            ],
            valid: || json!({"policy": "zone-sync", "max_lag_ms": 2000}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/access",
            fields: &["nbd_clients"],
            valid: || json!({"nbd_clients": ["host-a", "backup"]}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/promote",
            fields: &["zone"],
            valid: || json!({"zone": "z1"}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/check",
            fields: &["repair"],
            valid: || json!({"repair": false}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/snapshot",
            fields: &["snap"],
            valid: || json!({"snap": "fz-snap"}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/clone",
            fields: &["names", "ephemeral"],
            valid: || json!({"names": ["fz-c1", "fz-c2"], "ephemeral": false}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/rollback",
            fields: &["snap"],
            valid: || json!({"snap": "fz-snap"}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/flatten",
            fields: &[],
            valid: || json!({}),
        },
        Route {
            method: "POST",
            path: "/api/vdis/{v}/sync",
            fields: &["timeout_s"],
            valid: || json!({"timeout_s": 1}),
        },
        Route {
            method: "POST",
            path: "/api/settings",
            fields: &[
                "default_copies",
                "down_after_ms",
                "recovery_mib_s",
                "hold_down_ms",
                "noout",
                "backfill_full_pct",
            ],
            valid: || json!({"recovery_mib_s": 100}),
        },
        Route {
            method: "POST",
            path: "/api/tokens",
            fields: &["name", "role"],
            valid: || json!({"name": "fz-token", "role": "read-only"}),
        },
        Route {
            method: "POST",
            path: "/api/bench/locks",
            fields: &["vdis", "count"],
            valid: || json!({"vdis": ["drove-bench-x"], "count": 1}),
        },
        Route {
            method: "DELETE",
            path: "/api/vdis/{v}",
            fields: &[],
            valid: || json!({}),
        },
    ]
}

/// Names the paths point at: the fuzz's own VDIs, names that do not exist, and
/// percent-encoded oddities. Never [`KEEP`].
const PATH_NAMES: &[&str] = &[
    "fz-target",
    "fz-target",
    "fz-snap",
    "fz-new",
    "fz-renamed",
    "fz-c1",
    "nothing",
    "%2e%2e",
    "a%00b",
    "%ff%fe",
    "x%2fy",
    "%20",
];

/// Strings a field may get.
const STRINGS: &[&str] = &[
    "",
    "sync",
    "zone-sync",
    "direct",
    "chain",
    "z1",
    "z9",
    "read-only",
    "admin",
    "operator",
    "fz-target",
    "fz-snap",
    "keep",
    "drove-bench-x",
    "../../etc/passwd",
    "a\u{0}b",
    "é日本",
    "\u{202e}evil",
    "-1",
    "1e309",
    "null",
    "{\"a\":1}",
    "host-a",
    " ",
];

/// Numbers a field may get: edges of every integer width, and floats.
fn number(r: &mut Rng) -> Value {
    match r.below(14) {
        0 => json!(0),
        1 => json!(1),
        2 => json!(-1),
        3 => json!(u8::MAX),
        4 => json!(u16::MAX as u64 + 1),
        5 => json!(u32::MAX),
        6 => json!(u64::MAX),
        7 => json!(i64::MIN),
        8 => json!(1u64 << 53),
        9 => json!(1.5),
        10 => json!(-0.0),
        11 => json!(1e300),
        12 => json!(16u64 << 20),
        _ => json!(r.below(5000)),
    }
}

fn string(r: &mut Rng) -> Value {
    match r.below(6) {
        0 => Value::String("x".repeat(r.below(70_000) as usize)),
        1 => Value::String(
            (0..r.below(40))
                .map(|_| char::from_u32(r.below(0x3000) as u32).unwrap_or('?'))
                .collect(),
        ),
        _ => Value::String(r.pick(STRINGS).to_string()),
    }
}

fn value(r: &mut Rng, depth: u32) -> Value {
    match r.below(if depth > 3 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(r.below(2) == 0),
        2 | 3 => number(r),
        4 => string(r),
        5 => Value::Array((0..r.below(8)).map(|_| value(r, depth + 1)).collect()),
        6 => Value::Array(
            (0..r.below(300))
                .map(|_| Value::String(r.pick(STRINGS).to_string()))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..r.below(5) {
                let k = match string(r) {
                    Value::String(s) => s,
                    _ => String::new(),
                };
                m.insert(k, value(r, depth + 1));
            }
            Value::Object(m)
        }
    }
}

/// Bodies are cut to this length: under the JSON extractor's 2 MB limit, so the
/// node reads each whole before it answers (a body it stops reading would have its
/// answer lost to a reset connection).
const MAX_BODY: usize = 1 << 20;

/// One hostile body for `route`.
fn body(r: &mut Rng, route: &Route) -> Vec<u8> {
    let mut b = any_body(r, route);
    b.truncate(MAX_BODY);
    b
}

fn any_body(r: &mut Rng, route: &Route) -> Vec<u8> {
    match r.below(10) {
        // The route's fields (some of them) with values of any kind.
        0..=3 => {
            let mut m = Map::new();
            for f in route.fields {
                if r.below(3) != 0 {
                    m.insert(f.to_string(), value(r, 0));
                }
            }
            if r.below(4) == 0 {
                m.insert("unknown_field".into(), value(r, 0));
            }
            serde_json::to_vec(&Value::Object(m)).unwrap()
        }
        // A well-formed body with one field given another value.
        4 | 5 => {
            let mut v = (route.valid)();
            if let (Some(m), Some(f)) = (
                v.as_object_mut(),
                (!route.fields.is_empty()).then(|| *r.pick(route.fields)),
            ) {
                m.insert(f.to_string(), value(r, 0));
            }
            serde_json::to_vec(&v).unwrap()
        }
        // A well-formed body with its bytes flipped, cut or repeated.
        6 | 7 => {
            let mut b = serde_json::to_vec(&(route.valid)()).unwrap();
            for _ in 0..=r.below(4) {
                if b.is_empty() {
                    break;
                }
                let i = r.below(b.len() as u64) as usize;
                match r.below(3) {
                    0 => b[i] = r.next() as u8,
                    1 => b.truncate(i),
                    _ => {
                        let tail = b[i..].to_vec();
                        b.extend_from_slice(&tail);
                    }
                }
            }
            b
        }
        // Not an object at all, or nested past any parser's patience.
        8 => match r.below(4) {
            0 => b"[]".to_vec(),
            1 => b"42".to_vec(),
            2 => format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
            _ => format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000)).into_bytes(),
        },
        // Random bytes.
        _ => (0..r.below(2048)).map(|_| r.next() as u8).collect(),
    }
}

/// One request with `Connection: close`: the status code, or `None` when the
/// node closed the connection without an answer.
fn request(addr: &str, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).expect("the node's admin port refused a connection");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    // A node may answer before it has read the whole body (an early refusal): the
    // answer is read all the same.
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

fn env_or(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

#[test]
fn test_hostile_json_bodies_on_every_admin_route_never_crash_the_node() {
    if !require(&["qemu-io"]) {
        return;
    }
    let seed = env_or("DROVE_FUZZ_SEED", 1);
    let cases = env_or("DROVE_FUZZ_CASES", 40);
    let c = Cluster::start(1, 1);
    let n = &c.nodes[0];
    c.create_vdi(KEEP, "16M", &[]);
    qemu_io(&n.uri(KEEP), &["write -P 0x5c 0 4M".into(), "flush".into()]);
    c.create_vdi("fz-target", "16M", &[]);
    c.create_vdi("drove-bench-x", "16M", &[]);
    let before = drove_testkit::rss_bytes(Some(n.pid)).expect("the node is not running");

    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut seen = std::collections::BTreeMap::<u16, u64>::new();
    let mut sent = 0u64;
    for route in routes() {
        for case in 0..cases {
            // The fuzz's own VDI comes back when a case deleted or renamed it, so
            // that later cases reach the handlers' deeper checks.
            if case % 10 == 0 {
                let _ = c.drove(0, &["vdi", "create", "fz-target", "16M"]);
            }
            let name = *r.pick(PATH_NAMES);
            let path = route.path.replace("{v}", name);
            let b = body(&mut r, &route);
            let shown = String::from_utf8_lossy(&b[..b.len().min(300)]).into_owned();
            let answer = request(&n.admin, route.method, &path, &b);
            sent += 1;
            let Some((code, reply)) = answer else {
                panic!(
                    "seed {seed}, {} {path}: the node closed the connection without an \
                     answer (alive: {}) to the body {shown:?}",
                    route.method,
                    drove_testkit::rss_bytes(Some(n.pid)).is_some()
                );
            };
            let meant = matches!(code, 200..=299 | 400..=499 | 503 | 507);
            assert!(
                meant,
                "seed {seed}, {} {path}: HTTP {code} ({reply}) to the body {shown:?}",
                route.method
            );
            // Every refusal in the API's one error shape, axum's own included.
            if (400..=499).contains(&code) {
                let v: Value = serde_json::from_str(&reply).unwrap_or(Value::Null);
                assert!(
                    v["error"].is_string() && v["message"].is_string(),
                    "seed {seed}, {} {path}: HTTP {code} not in the JSON error shape: \
                     {reply:?}, to the body {shown:?}",
                    route.method
                );
            }
            *seen.entry(code).or_default() += 1;
        }
    }
    println!("seed {seed}: {sent} bodies, answers by status: {seen:?}");
    // Both refusals and acceptances were reached: the bodies were not all
    // rejected at the door.
    assert!(
        seen.keys().any(|&c| c < 300),
        "nothing was accepted: {seen:?}"
    );
    assert!(
        seen.keys().any(|&c| c == 400 || c == 422),
        "nothing was refused as malformed: {seen:?}"
    );

    let after = drove_testkit::rss_bytes(Some(n.pid)).expect("the node died under the fuzz");
    println!(
        "node memory: {} MiB before, {} MiB after",
        before >> 20,
        after >> 20
    );
    assert!(
        after < before + (256 << 20),
        "the node grew from {} MiB to {} MiB",
        before >> 20,
        after >> 20
    );
    let log = std::fs::read_to_string(std::path::Path::new(&n.data).join("node.log")).unwrap();
    assert!(!log.contains("panicked"), "the node logged a panic:\n{log}");
    let o = c.drove(0, &["cluster", "status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    qemu_io(&n.uri(KEEP), &["read -P 0x5c 0 4M".into()]);
}
