//! `drove bench meta`: the control plane's throughput and latency (issue 15). Starts
//! a local cluster of 3 nodes (or uses one `drove up` started) and measures, at each
//! number of requests in flight, against the metadata leader and a follower:
//!
//! - `create`, `snapshot`, `clone`, `delete`, `list` through the admin API, as
//!   `drove vdi ...` sends them;
//! - `lock`: one write-lock acquire and its release, run by the node itself as its
//!   gateway takes and gives back a lock (`POST /api/bench/locks`: proposed on the
//!   leader, forwarded to it from a follower); each worker its own VDI;
//! - `attach`: an NBD client on the node's unix socket opens a VDI, writes 4 KiB
//!   (which takes the write lock), and disconnects (which gives it back); each
//!   worker its own VDI;
//! - `list10k`: `GET /api/vdis?consistent=true` once the table holds `--list-vdis`
//!   VDIs, one request at a time.
//!
//! Every operation counts once: a `lock` operation is two Raft commands (acquire and
//! release). Results go to DIR/results.md and DIR/results.json.
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use drove_types::local_cluster::{ClusterFile, NodeEntry};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::print_json;
use drove_daemon::api::{BenchLocks, BenchResult};
use drove_daemon::BENCH_PREFIX;

/// Every operation the benchmark knows, in the order it runs them.
const OPS: [&str; 7] = [
    "create", "snapshot", "clone", "lock", "attach", "delete", "list",
];

/// Size of the VDIs the benchmark creates (nothing is written but 4 KiB).
const VDI_SIZE: u64 = 64 << 20;

/// The targets on this machine (3 voters), per operation, in ops/s.
fn target(op: &str) -> Option<&'static str> {
    match op {
        "lock" => Some(">= 20,000 lock operations/s (10,000 acquire+release)"),
        "create" => Some(">= 5,000/s"),
        "attach" => Some("p50 <= 5 ms"),
        "list10k" => Some("<= 50 ms"),
        _ => None,
    }
}

#[derive(Args)]
pub struct MetaArgs {
    /// Operations to measure, comma-separated, from create, snapshot, clone, lock,
    /// attach, delete, list, list10k (list10k fills the table to --list-vdis VDIs
    /// first) [default: all].
    #[arg(long)]
    ops: Option<String>,
    /// Requests in flight, comma-separated.
    #[arg(long, default_value = "1,32,256")]
    inflight: String,
    /// Operations in each measurement (per operation, in-flight level and node);
    /// at least the number in flight.
    #[arg(long, default_value_t = 1000)]
    count: usize,
    /// VDIs in the table for list10k.
    #[arg(long, default_value_t = 10_000)]
    list_vdis: usize,
    /// Measure against these nodes: leader, follower or both.
    #[arg(long, default_value = "leader,follower")]
    targets: String,
    /// Use the running local cluster in DIR (`drove up --dir DIR`, without --tls)
    /// instead of starting one of 3 nodes.
    #[arg(long, value_name = "DIR")]
    cluster_dir: Option<PathBuf>,
    /// Output directory [default: bench/results/meta-DATE].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// `leader` or `follower`.
    pub target: String,
    pub op: String,
    pub inflight: usize,
    pub count: usize,
    pub failed: usize,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The first failure's message, if any.
    #[serde(default)]
    pub first_error: Option<String>,
}

struct Bench {
    http: reqwest::Client,
    leader: NodeEntry,
    follower: Option<NodeEntry>,
    /// Distinguishes this run's names.
    run: u64,
}

fn say(msg: impl std::fmt::Display) {
    // Not eprintln!: a closed stderr must not panic.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn parse_list(s: &str, what: &str) -> Result<Vec<usize>> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=4096).contains(n))
                .ok_or_else(|| anyhow!("Bad {what} '{x}': give numbers from 1 to 4096"))
        })
        .collect::<Result<_>>()?;
    if v.is_empty() {
        bail!("No {what} given");
    }
    Ok(v)
}

fn parse_ops(s: Option<&str>) -> Result<Vec<String>> {
    let Some(s) = s else {
        let mut all: Vec<String> = OPS.iter().map(|s| s.to_string()).collect();
        all.push("list10k".into());
        return Ok(all);
    };
    let mut v = Vec::new();
    for op in s.split(',').map(str::trim) {
        if !OPS.contains(&op) && op != "list10k" {
            bail!(
                "Unknown operation '{op}': choose from {}, list10k",
                OPS.join(", ")
            );
        }
        v.push(op.to_string());
    }
    Ok(v)
}

/// Run the benchmark; Ctrl-C or SIGTERM stop it, and the cluster it started.
pub async fn run(a: MetaArgs, json_out: bool) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("Cannot watch SIGTERM")?;
    // Dropping the unfinished run stops its cluster and removes its directory.
    tokio::select! {
        r = measure_all(a, json_out) => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted: the benchmark's cluster is stopped"),
        _ = term.recv() => bail!("terminated: the benchmark's cluster is stopped"),
    }
}

async fn measure_all(a: MetaArgs, json_out: bool) -> Result<()> {
    let ops = parse_ops(a.ops.as_deref())?;
    let inflight = parse_list(&a.inflight, "in-flight level")?;
    let targets: Vec<String> = a.targets.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(t) = targets.iter().find(|t| *t != "leader" && *t != "follower") {
        bail!("Unknown target '{t}': use leader, follower or leader,follower");
    }
    if a.count == 0 {
        bail!("--count must be at least 1");
    }
    let out = a.out.clone().unwrap_or_else(|| {
        PathBuf::from("bench/results")
            .join(format!("meta-{}", drove_paperbench::report::date_stamp()))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("Cannot create {}", out.display()))?;

    // A cluster of our own unless one was named: stopped (`own`), then its
    // directory removed (`_scratch`), when they are dropped, on errors too.
    // Locals drop in reverse order: the cluster before its directory.
    let mut _scratch = None;
    let mut own = None;
    let dir = match &a.cluster_dir {
        Some(d) => d.clone(),
        None => {
            let tmp = Scratch::new()?;
            say(format!(
                "drove bench meta: starting 3 nodes in {}",
                tmp.0.display()
            ));
            let dir = tmp.0.clone();
            _scratch = Some(tmp);
            let bin = std::env::current_exe().context("Cannot find the drove binary")?;
            own = Some(drove_paperbench::cluster::DroveCluster::start(
                &bin, &dir, 3, 1, 3,
            )?);
            dir
        }
    };
    let nodes = read_cluster(&dir)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .timeout(Duration::from_secs(60))
        .build()
        .context("Cannot make an HTTP client")?;
    let (leader, follower) = leader_and_follower(&http, &nodes).await?;
    let b = Arc::new(Bench {
        http,
        leader,
        follower,
        run: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let started = Instant::now();
    let mut results = Vec::new();
    for t in &targets {
        let on_leader = t == "leader";
        if !on_leader && b.follower.is_none() {
            say("no follower: the cluster has one node; follower measurements skipped");
            continue;
        }
        for &n in &inflight {
            let count = a.count.max(n);
            for op in ops.iter().filter(|o| *o != "list10k") {
                let m = b.clone().measure(op, on_leader, n, count).await?;
                report_line(&m);
                results.push(m);
            }
            // Every command costs more with a larger VDI table (see
            // docs/control-plane.md): each level starts from the same small one.
            b.clone().clean_up(on_leader, n, count).await?;
        }
    }
    if ops.iter().any(|o| o == "list10k") {
        for m in b.clone().list_big(a.list_vdis, &targets).await? {
            report_line(&m);
            results.push(m);
        }
    }
    let took = started.elapsed().as_secs_f64();
    write_results(&out, &results, took)?;
    drop(own);
    if !json_out {
        println!("results: {}", out.join("results.md").display());
        println!("took {took:.0} s");
    } else {
        print_json(&json!({
            "measurements": results,
            "results": out.join("results.md"),
            "seconds": took,
        }))?;
    }
    Ok(())
}

/// The benchmark's own cluster directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let base = std::env::temp_dir().join(format!("drove-bench-meta-{}", std::process::id()));
        if base.exists() {
            std::fs::remove_dir_all(&base).ok();
        }
        std::fs::create_dir_all(&base)
            .with_context(|| format!("Cannot create {}", base.display()))?;
        Ok(Scratch(base))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_cluster(dir: &Path) -> Result<Vec<NodeEntry>> {
    let path = dir.join("cluster.json");
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "Cannot read {} (start a cluster with `drove up --dir {}`)",
            path.display(),
            dir.display()
        )
    })?;
    let f: ClusterFile = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a cluster file", path.display()))?;
    if f.nodes.iter().any(|n| n.tls_dir.is_some()) {
        bail!(
            "The cluster in {} runs with TLS; the benchmark speaks plain HTTP and NBD",
            dir.display()
        );
    }
    Ok(f.nodes)
}

async fn leader_and_follower(
    http: &reqwest::Client,
    nodes: &[NodeEntry],
) -> Result<(NodeEntry, Option<NodeEntry>)> {
    let first = nodes
        .first()
        .ok_or_else(|| anyhow!("The cluster has no node"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let s: Value = http
            .get(format!("http://{}/api/status", first.admin))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .context("Cannot ask the cluster for its status")?
            .json()
            .await?;
        if let Some(l) = s["leader"].as_u64() {
            break l;
        }
        if Instant::now() > deadline {
            bail!("The cluster has no metadata leader");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let l = nodes
        .iter()
        .find(|n| n.id == leader)
        .ok_or_else(|| anyhow!("The leader, node {leader}, is not in cluster.json"))?;
    let f = nodes.iter().find(|n| n.id != leader);
    Ok((l.clone(), f.cloned()))
}

fn report_line(m: &Measured) {
    let err = m
        .first_error
        .as_deref()
        .map(|e| format!(" (first failure: {e})"))
        .unwrap_or_default();
    say(format!(
        "{:8} {:8} {:4} in flight: {:8.0}/s, p50 {:7.2} ms, p99 {:7.2} ms, {} of {} failed{err}",
        m.target, m.op, m.inflight, m.per_second, m.p50_ms, m.p99_ms, m.failed, m.count
    ));
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
    sorted[i]
}

/// What one operation did: its latency, or why it failed.
type OpResult = std::result::Result<Duration, String>;

impl Measured {
    /// The measurement of `ops`, done `inflight` at a time in `took`.
    fn of(target: &str, op: &str, inflight: usize, ops: Vec<OpResult>, took: Duration) -> Self {
        let mut lat: Vec<f64> = ops
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        lat.sort_by(f64::total_cmp);
        let count = ops.len();
        Measured {
            target: target.into(),
            op: op.into(),
            inflight,
            count,
            failed: count - lat.len(),
            per_second: lat.len() as f64 / took.as_secs_f64(),
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
            first_error: ops.into_iter().find_map(|r| r.err()),
        }
    }
}

impl Bench {
    fn node(&self, on_leader: bool) -> &NodeEntry {
        if on_leader {
            &self.leader
        } else {
            self.follower.as_ref().unwrap_or(&self.leader)
        }
    }

    fn prefix(&self, op: &str, on_leader: bool, inflight: usize) -> String {
        format!(
            "{BENCH_PREFIX}{}-{}{}-{}",
            self.run,
            if on_leader { "l" } else { "f" },
            inflight,
            op
        )
    }

    /// Run `count` operations `op`, `inflight` at a time.
    async fn measure(
        self: Arc<Self>,
        op: &str,
        on_leader: bool,
        inflight: usize,
        count: usize,
    ) -> Result<Measured> {
        let p = self.prefix("", on_leader, inflight);
        // What the operation needs beforehand.
        match op {
            "snapshot" | "delete" => {
                // The VDIs of this level's create run; made now if it did not run.
                self.ensure_vdis(&format!("{p}c"), count, on_leader).await?;
            }
            "clone" => {
                let base = format!("{p}base");
                self.admin_ok("POST", on_leader, "/api/vdis", Some(vdi_body(&base)))
                    .await?;
                self.admin_ok(
                    "POST",
                    on_leader,
                    &format!("/api/vdis/{base}/snapshot"),
                    Some(json!({"snap": format!("{p}gold")})),
                )
                .await?;
            }
            "lock" | "attach" => {
                self.ensure_vdis(&format!("{p}{op}"), inflight, on_leader)
                    .await?;
            }
            _ => {}
        }
        if op == "lock" {
            return self.node_locks(&p, on_leader, inflight, count).await;
        }
        let next = Arc::new(AtomicUsize::new(0));
        let t0 = Instant::now();
        let mut workers = Vec::new();
        for w in 0..inflight {
            let b = self.clone();
            let next = next.clone();
            let op = op.to_string();
            let p = p.clone();
            workers.push(tokio::spawn(async move {
                let mut done: Vec<OpResult> = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    let r = match op.as_str() {
                        "attach" => b.attach_cycle(on_leader, &format!("{p}attach{w}")).await,
                        _ => b.admin_op(&op, on_leader, &p, i).await,
                    };
                    done.push(r);
                }
                done
            }));
        }
        let mut all = Vec::new();
        for w in workers {
            all.extend(
                w.await
                    .map_err(|e| anyhow!("A benchmark task failed: {e}"))?,
            );
        }
        let target = if on_leader { "leader" } else { "follower" };
        Ok(Measured::of(target, op, inflight, all, t0.elapsed()))
    }

    /// `count` lock cycles run by the node itself, `inflight` VDIs at once.
    async fn node_locks(
        &self,
        p: &str,
        on_leader: bool,
        inflight: usize,
        count: usize,
    ) -> Result<Measured> {
        let req = BenchLocks {
            vdis: (0..inflight).map(|w| format!("{p}lock{w}")).collect(),
            count,
        };
        let url = format!("http://{}/api/bench/locks", self.node(on_leader).admin);
        let r = self
            .http
            .post(&url)
            .timeout(Duration::from_secs(3600))
            .json(&req)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = r.status();
        let text = r.text().await.with_context(|| format!("POST {url}"))?;
        if !status.is_success() {
            bail!("POST {url}: {status}: {text}");
        }
        let b: BenchResult = serde_json::from_str(&text)
            .with_context(|| format!("POST {url}: not a benchmark result: {text}"))?;
        Ok(Measured {
            target: if on_leader { "leader" } else { "follower" }.into(),
            op: "lock".into(),
            inflight,
            count,
            failed: b.failed,
            per_second: (count - b.failed.min(count)) as f64 / b.seconds.max(1e-9),
            p50_ms: b.p50_ms,
            p99_ms: b.p99_ms,
            first_error: b.first_error,
        })
    }

    /// Delete what level (`on_leader`, `inflight`) left: its VDIs not deleted by
    /// `delete`, snapshots, clones, and the VDIs of `lock` and `attach`. Not timed.
    async fn clean_up(
        self: Arc<Self>,
        on_leader: bool,
        inflight: usize,
        count: usize,
    ) -> Result<()> {
        let p = self.prefix("", on_leader, inflight);
        // Children before their parents: a snapshot with children is kept.
        let rounds: Vec<Vec<String>> = vec![
            (0..count)
                .flat_map(|i| [format!("{p}c{i}"), format!("{p}k{i}")])
                .chain([format!("{p}base")])
                .chain((0..inflight).flat_map(|w| [format!("{p}lock{w}"), format!("{p}attach{w}")]))
                .collect(),
            (0..count)
                .map(|i| format!("{p}s{i}"))
                .chain([format!("{p}gold")])
                .collect(),
        ];
        for names in rounds {
            self.for_each(names, on_leader, "DELETE").await?;
        }
        Ok(())
    }

    /// `name0..name{n}`, created (256 at a time) unless they exist.
    async fn ensure_vdis(self: &Arc<Self>, name: &str, n: usize, on_leader: bool) -> Result<()> {
        let names = (0..n).map(|i| format!("{name}{i}")).collect();
        self.for_each(names, on_leader, "POST").await
    }

    /// Create (`POST`) or delete (`DELETE`, forced) each VDI of `names`, 256 at a
    /// time; one that exists already (create) or is gone (delete) is fine.
    async fn for_each(
        self: &Arc<Self>,
        names: Vec<String>,
        on_leader: bool,
        method: &'static str,
    ) -> Result<()> {
        let names = Arc::new(names);
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..names.len().min(256) {
            let (b, names, next) = (self.clone(), names.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(name) = names.get(i) else {
                        return Ok(());
                    };
                    let (path, body, fine) = match method {
                        "POST" => ("/api/vdis".to_string(), Some(vdi_body(name)), 409),
                        _ => (format!("/api/vdis/{name}?force=true"), None, 404),
                    };
                    match b.admin(method, on_leader, &path, body).await {
                        Ok((s, _)) if s.is_success() || s.as_u16() == fine => {}
                        Ok((s, text)) => return Err(anyhow!("{method} {name}: {s}: {text}")),
                        Err(e) => return Err(anyhow!("{method} {name}: {e}")),
                    }
                }
            }));
        }
        for t in tasks {
            t.await
                .map_err(|e| anyhow!("A benchmark task failed: {e}"))??;
        }
        Ok(())
    }

    async fn admin(
        &self,
        method: &str,
        on_leader: bool,
        path: &str,
        body: Option<Value>,
    ) -> std::result::Result<(reqwest::StatusCode, String), String> {
        let url = format!("http://{}{path}", self.node(on_leader).admin);
        let req = match method {
            "POST" => self.http.post(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.get(url),
        };
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        let r = req.send().await.map_err(|e| e.to_string())?;
        let status = r.status();
        let text = r.text().await.map_err(|e| e.to_string())?;
        Ok((status, text))
    }

    async fn admin_ok(
        &self,
        method: &str,
        on_leader: bool,
        path: &str,
        body: Option<Value>,
    ) -> Result<()> {
        match self.admin(method, on_leader, path, body).await {
            Ok((s, _)) if s.is_success() => Ok(()),
            Ok((s, t)) => bail!("{method} {path}: {s}: {t}"),
            Err(e) => bail!("{method} {path}: {e}"),
        }
    }

    /// Operation `i` of an admin API measurement.
    async fn admin_op(&self, op: &str, on_leader: bool, p: &str, i: usize) -> OpResult {
        let (method, path, body) = match op {
            "create" => (
                "POST",
                "/api/vdis".to_string(),
                Some(vdi_body(&format!("{p}c{i}"))),
            ),
            "snapshot" => (
                "POST",
                format!("/api/vdis/{p}c{i}/snapshot"),
                Some(json!({"snap": format!("{p}s{i}")})),
            ),
            "clone" => (
                "POST",
                format!("/api/vdis/{p}gold/clone"),
                Some(json!({"names": [format!("{p}k{i}")]})),
            ),
            "delete" => ("DELETE", format!("/api/vdis/{p}c{i}"), None),
            _ => ("GET", "/api/vdis".to_string(), None),
        };
        let t = Instant::now();
        match self.admin(method, on_leader, &path, body).await? {
            (s, _) if s.is_success() => Ok(t.elapsed()),
            (s, text) => Err(format!("{method} {path}: {s}: {text}")),
        }
    }

    /// Open VDI `name` over NBD on the node's unix socket, write 4 KiB at offset 0,
    /// disconnect: the time from connect to the write's reply.
    async fn attach_cycle(&self, on_leader: bool, name: &str) -> OpResult {
        let path = &self.node(on_leader).nbd_unix;
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(60), nbd_write_once(path, name)).await;
        match r {
            Ok(Ok(())) => Ok(t.elapsed()),
            Ok(Err(e)) => Err(format!("attach {name}: {e:#}")),
            Err(_) => Err(format!("attach {name}: no answer within 60 s")),
        }
    }

    /// Fill the table to `n` VDIs, then time `GET /api/vdis?consistent=true` (what
    /// `drove vdi list` sends), one at a time, 20 times per node.
    async fn list_big(self: Arc<Self>, n: usize, targets: &[String]) -> Result<Vec<Measured>> {
        let have = self.count_vdis().await?;
        if have < n {
            say(format!("list10k: creating {} VDIs to have {n}", n - have));
            let name = format!("{BENCH_PREFIX}{}-fill", self.run);
            self.ensure_vdis(&name, n - have, true).await?;
        }
        let have = self.count_vdis().await?;
        let mut out = Vec::new();
        for t in targets {
            let on_leader = t == "leader";
            if !on_leader && self.follower.is_none() {
                continue;
            }
            let mut all = Vec::new();
            let t0 = Instant::now();
            for _ in 0..20 {
                let t = Instant::now();
                let path = "/api/vdis?consistent=true";
                all.push(match self.admin("GET", on_leader, path, None).await {
                    Ok((s, _)) if s.is_success() => Ok(t.elapsed()),
                    Ok((s, text)) => Err(format!("{s}: {text}")),
                    Err(e) => Err(e),
                });
            }
            out.push(Measured::of(
                t,
                &format!("list{have}"),
                1,
                all,
                t0.elapsed(),
            ));
        }
        Ok(out)
    }

    async fn count_vdis(&self) -> Result<usize> {
        let (s, text) = self
            .admin("GET", true, "/api/vdis", None)
            .await
            .map_err(|e| anyhow!("GET /api/vdis: {e}"))?;
        if !s.is_success() {
            bail!("GET /api/vdis: {s}: {text}");
        }
        let v: Value = serde_json::from_str(&text).context("GET /api/vdis: not JSON")?;
        Ok(v.as_array().map_or(0, Vec::len))
    }
}

fn vdi_body(name: &str) -> Value {
    json!({"name": name, "size": VDI_SIZE})
}

/// An NBD client's whole life on a unix socket: fixed newstyle handshake, `GO` to
/// export `name`, one 4 KiB write, `DISC`.
async fn nbd_write_once(path: &str, name: &str) -> Result<()> {
    let target = crate::nbd_client::Target::Unix(PathBuf::from(path));
    let mut c = crate::nbd_client::NbdClient::connect(&target, name).await?;
    c.write(0, &[0x5a; 4096]).await?;
    c.disconnect().await
}

fn write_results(out: &Path, results: &[Measured], secs: f64) -> Result<()> {
    let cmd = std::env::args().collect::<Vec<_>>().join(" ");
    let mut md = String::new();
    md.push_str(&format!(
        "# drove bench meta ({})\n\n    {cmd}\n\n{} measurements in {secs:.0} s. ops/s, p50 / p99 latency. \
         A `lock` operation is one acquire and its release (two Raft commands), \
         run by the node as its gateway runs them (forwarded to the leader from a follower); \
         `attach` is an NBD connect, a 4 KiB write (which takes the write lock) \
         and a disconnect (which releases it).\n\n",
        drove_paperbench::report::date_stamp(),
        results.len()
    ));
    md.push_str("| node | operation | in flight | ops/s | p50 ms | p99 ms | failed | target |\n");
    md.push_str("|---|---|---|---|---|---|---|---|\n");
    for m in results {
        let tgt = if m.op.starts_with("list") && m.op != "list" {
            target("list10k")
        } else {
            target(&m.op)
        };
        md.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {} of {} | {} |\n",
            m.target,
            m.op,
            m.inflight,
            m.per_second,
            m.p50_ms,
            m.p99_ms,
            m.failed,
            m.count,
            tgt.unwrap_or("")
        ));
    }
    let errors: Vec<&Measured> = results.iter().filter(|m| m.first_error.is_some()).collect();
    if !errors.is_empty() {
        md.push_str("\nFirst failure of each measurement with failures:\n\n");
        for m in errors {
            md.push_str(&format!(
                "- {} {} x{}: {}\n",
                m.target,
                m.op,
                m.inflight,
                m.first_error.as_deref().unwrap_or("")
            ));
        }
    }
    std::fs::write(out.join("results.md"), md)
        .with_context(|| format!("Cannot write {}", out.join("results.md").display()))?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_vec_pretty(results)?,
    )
    .with_context(|| format!("Cannot write {}", out.join("results.json").display()))?;
    Ok(())
}
