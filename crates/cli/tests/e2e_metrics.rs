//! The operations metrics, alert rules and dashboard against the real thing:
//! `promtool` checks the rules and a generated config, and a real Prometheus
//! scrapes a real 3-node cluster every second, evaluates the rules without error
//! and sees every node's build info; every `drove_*` name the rules and dashboard
//! use is in a real scrape.
mod common;
use common::*;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `q` percent-encoded for a query string.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus process, killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    /// `GET /api/v1/<path>` as JSON (`None` while it does not answer).
    fn api(&self, path: &str) -> Option<serde_json::Value> {
        let o = Command::new("curl")
            .args(["-sf", "--max-time", "5"])
            .arg(format!("http://{}/api/v1/{path}", self.addr))
            .output()
            .ok()?;
        if !o.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        (v["status"] == "success").then(|| v["data"].clone())
    }

    fn query(&self, q: &str) -> Vec<serde_json::Value> {
        self.api(&format!("query?query={}", encode(q)))
            .and_then(|d| d["result"].as_array().cloned())
            .unwrap_or_default()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every `drove_<name>` in `text` (a crude scan of PromQL and JSON).
fn drove_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("drove_") {
        let start = i + at;
        let ok_before =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start + "drove_".len();
        while end < b.len() && (b[end].is_ascii_lowercase() || b[end] == b'_') {
            end += 1;
        }
        if ok_before {
            out.insert(text[start..end].to_string());
        }
        i = end;
    }
    out
}

/// The sample names of a scrape (`drove_x_total`, `drove_y_bucket`, ...).
fn sample_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn test_alert_rules_and_dashboard_load_into_a_real_prometheus_scraping_a_cluster() {
    if !require(&["promtool", "prometheus", "curl", "qemu-io"]) {
        return;
    }
    let rules = repo().join("ops/prometheus/drove-alerts.yml");
    let dashboard = repo().join("ops/grafana/drove-dashboard.json");
    let o = run(Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules));
    eprintln!("promtool check rules: {}", text(&o));
    assert!(o.status.success(), "promtool check rules: {}", text(&o));
    let rule_count = std::fs::read_to_string(&rules)
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert!(rule_count >= 7, "{rule_count} rules");

    let c = Cluster::start(3, 3);
    // Traffic, so that the NBD, gateway and zone-sync families have series.
    c.create_vdi("m", "64M", &["--copies", "3", "--policy", "zone-sync"]);
    qemu_io(
        &c.nodes[0].uri("m"),
        &[
            "write -P 0x5a 0 1M".to_string(),
            "read -P 0x5a 0 1M".to_string(),
        ],
    );

    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(&rules, tmp.path().join("drove-alerts.yml")).unwrap();
    let targets: Vec<String> = c.nodes.iter().map(|n| format!("'{}'", n.admin)).collect();
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - drove-alerts.yml\n\
             scrape_configs:\n  - job_name: drove\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let o = run(Command::new("promtool")
        .arg("check")
        .arg("config")
        .arg(&config));
    eprintln!("promtool check config: {}", text(&o));
    assert!(o.status.success(), "promtool check config: {}", text(&o));

    let addr = format!("127.0.0.1:{}", free_port());
    let log = tmp.path().join("prometheus.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            tmp.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start prometheus");
    let p = Prometheus { child, addr, log };
    eprintln!("prometheus on {} scraping {}", p.addr, targets.join(", "));

    // All three targets scraped and up.
    let want: BTreeSet<String> = c.nodes.iter().map(|n| n.admin.clone()).collect();
    let mut last = serde_json::Value::Null;
    let up_targets = || -> BTreeSet<String> {
        let Some(d) = p.api("targets") else {
            return BTreeSet::new();
        };
        d["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["health"] == "up")
            .filter_map(|t| t["labels"]["instance"].as_str().map(str::to_string))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while up_targets() != want {
        if std::time::Instant::now() > deadline {
            last = p.api("targets").unwrap_or_default();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        up_targets(),
        want,
        "targets: {last}\nprometheus log:\n{}",
        p.log()
    );
    let up = p.query("up");
    assert_eq!(up.len(), 3, "{up:?}");
    assert!(up.iter().all(|s| s["value"][1] == "1"), "{up:?}");
    wait_until(Duration::from_secs(30), "3 drove_build_info series", || {
        p.query("drove_build_info").len() == 3
    });
    let info = p.query("drove_build_info");
    eprintln!("drove_build_info: {info:?}");
    assert!(
        info.iter()
            .all(|s| s["metric"]["version"] == env!("CARGO_PKG_VERSION")),
        "{info:?}"
    );
    let nodes = p.query("drove_cluster_nodes{state=\"up\"}");
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert!(nodes.iter().all(|s| s["value"][1] == "3"), "{nodes:?}");

    // Every rule loaded and evaluated without error.
    let rule_health = || -> Vec<(String, String, String)> {
        p.api("rules")
            .map(|d| {
                d["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                    .map(|r| {
                        (
                            r["name"].as_str().unwrap_or("").to_string(),
                            r["health"].as_str().unwrap_or("").to_string(),
                            r["lastError"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(30), "every rule evaluated", || {
        let r = rule_health();
        r.len() == rule_count && r.iter().all(|(_, h, _)| h != "unknown")
    });
    let health = rule_health();
    eprintln!("rules: {health:?}");
    assert!(
        health.iter().all(|(_, h, _)| h == "ok"),
        "rule errors: {health:?}"
    );

    // Every drove_* name the rules and the dashboard use is in a real scrape.
    let mut scraped = BTreeSet::new();
    for i in 0..3 {
        scraped.extend(sample_names(&c.metrics(i)));
    }
    let board = std::fs::read_to_string(&dashboard).unwrap();
    let json: serde_json::Value = serde_json::from_str(&board).expect("dashboard is JSON");
    let panels = json["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let exprs: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    let mut used = drove_names(&std::fs::read_to_string(&rules).unwrap());
    for e in &exprs {
        used.extend(drove_names(e));
    }
    let missing: Vec<&String> = used.iter().filter(|n| !scraped.contains(*n)).collect();
    eprintln!(
        "{} drove_* names used by the rules and dashboard, all checked against a scrape",
        used.len()
    );
    assert!(
        missing.is_empty(),
        "used in ops/ but not in a scrape: {missing:?}"
    );
    // And Prometheus evaluates every dashboard expression.
    for e in &exprs {
        let q = e.replace("$__rate_interval", "1m");
        assert!(
            p.api(&format!("query?query={}", encode(&q))).is_some(),
            "dashboard expression does not evaluate: {q}"
        );
    }
}
