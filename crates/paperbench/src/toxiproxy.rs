//! The WAN: toxiproxy (github.com/Shopify/toxiproxy v2.12.0), a userspace TCP proxy
//! whose "latency" toxic delays every chunk of data by a fixed time. One proxy per
//! cross-zone link, with a latency toxic on both streams (upstream = client to
//! server, downstream = back), adds the delay each way: a request/response round
//! trip grows by twice the delay. Driven through its REST API on 127.0.0.1:
//! `POST /proxies`, `POST /proxies/{name}/toxics`, and `GET /metrics` (bytes per
//! proxy, enabled by `-proxy-metrics`).
//!
//! drove's own proxy (`drove bench wan-proxy`, crate drove-wanproxy) speaks the same
//! part of that API, so [`Toxiproxy`] drives either: [`WanProxyKind`] chooses.
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::http;
use crate::procs::{free_port, on_path, wait_port, Cancel, ProcGuard};

const API_TIMEOUT: Duration = Duration::from_secs(10);

/// How to install toxiproxy, for error messages.
pub const INSTALL_HINT: &str = "install it with scripts/install-deps.sh, or: go install \
github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0 (binary $(go env GOPATH)/bin/server), \
or set TOXIPROXY_SERVER to its path";

fn is_toxiproxy(bin: &Path) -> bool {
    Command::new(bin)
        .arg("-version")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            text.contains("toxiproxy")
        })
        .unwrap_or(false)
}

fn go_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GOPATH") {
        return std::env::split_paths(&p).next();
    }
    for go in ["go", "/usr/local/go/bin/go"] {
        if let Ok(o) = Command::new(go).args(["env", "GOPATH"]).output() {
            let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if o.status.success() && !s.is_empty() {
                return Some(PathBuf::from(s));
            }
        }
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go"))
}

/// Find the toxiproxy server: $TOXIPROXY_SERVER, `toxiproxy-server` on PATH, or
/// the `server` binary `go install` put in $(go env GOPATH)/bin.
pub fn find_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOXIPROXY_SERVER") {
        let p = PathBuf::from(p);
        return is_toxiproxy(&p).then_some(p);
    }
    if on_path("toxiproxy-server") {
        return Some(PathBuf::from("toxiproxy-server"));
    }
    let cand = go_path()?.join("bin").join("server");
    (cand.is_file() && is_toxiproxy(&cand)).then_some(cand)
}

/// Which proxy server emulates the WAN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WanProxyKind {
    /// `drove bench wan-proxy`, run from the drove binary under test.
    Builtin,
    /// toxiproxy (found by [`find_binary`]).
    Toxiproxy,
}

impl WanProxyKind {
    /// The name `--wan-proxy` takes and results.md shows.
    pub fn name(self) -> &'static str {
        match self {
            WanProxyKind::Builtin => "builtin",
            WanProxyKind::Toxiproxy => "toxiproxy",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Result<WanProxyKind> {
        match s {
            "builtin" => Ok(WanProxyKind::Builtin),
            "toxiproxy" => Ok(WanProxyKind::Toxiproxy),
            _ => bail!("Unknown WAN proxy '{s}': use builtin or toxiproxy"),
        }
    }
}

/// A running proxy server (toxiproxy or drove's), killed when dropped.
#[derive(Debug)]
pub struct Toxiproxy {
    guard: ProcGuard,
    api: String,
}

impl Toxiproxy {
    /// Start toxiproxy `bin` on a free port of 127.0.0.1, its log in `log`.
    pub fn start(bin: &Path, log: &Path, cancel: &Cancel) -> Result<Self> {
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.args([
            "-host",
            "127.0.0.1",
            "-port",
            &port.to_string(),
            "-proxy-metrics",
        ]);
        Self::start_cmd(cmd, "toxiproxy", port, log, cancel)
    }

    /// Start drove's own proxy server (`drove bench wan-proxy`) from `drove_bin`.
    pub fn start_builtin(drove_bin: &Path, log: &Path, cancel: &Cancel) -> Result<Self> {
        let port = free_port()?;
        let mut cmd = Command::new(drove_bin);
        cmd.args(["bench", "wan-proxy", "--api", &format!("127.0.0.1:{port}")]);
        Self::start_cmd(cmd, "drove bench wan-proxy", port, log, cancel)
    }

    /// Start the server `kind` names (`drove_bin` runs the builtin one).
    pub fn start_kind(
        kind: WanProxyKind,
        drove_bin: &Path,
        log: &Path,
        cancel: &Cancel,
    ) -> Result<Self> {
        match kind {
            WanProxyKind::Builtin => Self::start_builtin(drove_bin, log, cancel),
            WanProxyKind::Toxiproxy => {
                let bin = find_binary()
                    .ok_or_else(|| anyhow!("toxiproxy is not installed: {INSTALL_HINT}"))?;
                Self::start(&bin, log, cancel)
            }
        }
    }

    fn start_cmd(
        mut cmd: Command,
        what: &str,
        port: u16,
        log: &Path,
        cancel: &Cancel,
    ) -> Result<Self> {
        let out = std::fs::File::create(log)
            .with_context(|| format!("Cannot create {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("Cannot start {what}"))?;
        let mut guard = ProcGuard::new(child, what);
        let api = format!("127.0.0.1:{port}");
        wait_port(&api, &mut guard, Duration::from_secs(15), cancel)
            .with_context(|| format!("{what} did not start; see {}", log.display()))?;
        let t = Toxiproxy { guard, api };
        let v = http::get_ok(&t.api, "/version", API_TIMEOUT)?;
        if v.trim().is_empty() {
            bail!("toxiproxy at {} gave no version", t.api);
        }
        Ok(t)
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// The API address.
    pub fn api(&self) -> &str {
        &self.api
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let r = http::request(
            &self.api,
            "POST",
            path,
            Some(&body.to_string()),
            API_TIMEOUT,
        )?;
        if !(200..300).contains(&r.status) {
            bail!(
                "toxiproxy POST {path} answered {}: {}",
                r.status,
                r.body.trim()
            );
        }
        serde_json::from_str(&r.body)
            .with_context(|| format!("toxiproxy POST {path}: answer is not JSON"))
    }

    /// Create proxy `name` to `upstream`, listening on a fresh port of 127.0.0.1;
    /// returns the address it listens on.
    pub fn create_proxy(&self, name: &str, upstream: &str) -> Result<String> {
        let v = self.post(
            "/proxies",
            &json!({"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true}),
        )?;
        let listen = v
            .get("listen")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("toxiproxy did not say where proxy {name} listens"))?;
        if listen.ends_with(":0") {
            bail!("toxiproxy gave proxy {name} no port ({listen})");
        }
        Ok(listen.to_string())
    }

    /// Add a latency toxic of `ms` to both directions of proxy `name`.
    pub fn add_latency(&self, name: &str, ms: u64) -> Result<()> {
        for stream in ["upstream", "downstream"] {
            let body = json!({
                "name": format!("latency_{stream}"),
                "type": "latency",
                "stream": stream,
                "toxicity": 1.0,
                "attributes": {"latency": ms, "jitter": 0},
            });
            let v = self.post(&format!("/proxies/{name}/toxics"), &body)?;
            let got = v.pointer("/attributes/latency").and_then(Value::as_u64);
            if got != Some(ms) {
                bail!("toxiproxy did not take the latency toxic on {name} ({stream}): {v}");
            }
        }
        Ok(())
    }

    /// Limit the `upstream` (client to server) direction of proxy `name` to `kb_s`
    /// KB per second (toxic `bandwidth_upstream`).
    pub fn add_bandwidth(&self, name: &str, kb_s: u64) -> Result<()> {
        let body = json!({
            "name": "bandwidth_upstream",
            "type": "bandwidth",
            "stream": "upstream",
            "toxicity": 1.0,
            "attributes": {"rate": kb_s},
        });
        let v = self.post(&format!("/proxies/{name}/toxics"), &body)?;
        if v.pointer("/attributes/rate").and_then(Value::as_u64) != Some(kb_s) {
            bail!("toxiproxy did not take the bandwidth toxic on {name}: {v}");
        }
        Ok(())
    }

    /// Remove toxic `toxic` (as named by [`Toxiproxy::add_latency`],
    /// [`Toxiproxy::add_bandwidth`]) from proxy `name`.
    pub fn remove_toxic(&self, name: &str, toxic: &str) -> Result<()> {
        let path = format!("/proxies/{name}/toxics/{toxic}");
        let r = http::request(&self.api, "DELETE", &path, None, API_TIMEOUT)?;
        if !(200..300).contains(&r.status) {
            bail!(
                "toxiproxy DELETE {path} answered {}: {}",
                r.status,
                r.body.trim()
            );
        }
        Ok(())
    }

    /// toxiproxy's Prometheus text (bytes per proxy and direction).
    pub fn metrics(&mut self) -> Result<String> {
        self.guard.check_running()?;
        http::get_ok(&self.api, "/metrics", API_TIMEOUT)
    }

    /// Stop the server now (also done on drop).
    pub fn stop(&mut self) {
        self.guard.stop();
    }
}
