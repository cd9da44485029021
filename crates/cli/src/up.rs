//! `drove up` and `drove down`: a local cluster of N node processes on 127.0.0.1,
//! for trying drove out and for tests. The layout is written to DIR/cluster.json so
//! that `down`, tests and scripts can find every node, and so that `up` on the same
//! DIR restarts the same nodes on the same ports with their data (those that are
//! not running: a node that died comes back beside the others).
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use drove_daemon::api::Status;
use drove_types::local_cluster::{ClusterFile, ClusterTls, NodeEntry};
use drove_types::private_fs;
use std::net::TcpListener;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::{print_json, Ctx};
use crate::procs::{alive, stop};
use crate::table;

#[derive(Args)]
pub struct UpArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Number of zones; nodes are put in zones round-robin [default: one zone per node].
    #[arg(long)]
    zones: Option<usize>,
    /// Fill the zones one after another (z1's nodes first, then z2's, ...) instead of
    /// round-robin: the order in which a site brought up zone by zone joins.
    #[arg(long)]
    grouped: bool,
    /// Add one witness after the --nodes data nodes: a metadata voter only (no
    /// objects, no NBD; `drove node run --witness`), in a zone of its own, so that
    /// with two zones of data nodes either zone can be lost and the metadata keeps
    /// its majority. New clusters only.
    #[arg(long)]
    witness: bool,
    /// The witness's zone [default: the zone after the data nodes' last, z3 for
    /// --zones 2].
    #[arg(long, value_name = "ZONE", requires = "witness")]
    witness_zone: Option<String>,
    /// Directory for the nodes' data, logs and cluster.json.
    #[arg(long, default_value = "drove-cluster")]
    dir: PathBuf,
    /// Default copies of new VDIs [default: min(3, nodes)].
    #[arg(long)]
    copies: Option<u8>,
    /// Start the nodes in the background and return; stop them with `drove down`.
    #[arg(long)]
    detach: bool,
    /// First admin port; node i uses BASE+10i (admin), +1 (peer), +2 (NBD). 0 picks free ports.
    #[arg(long, default_value_t = 7000)]
    base_port: u16,
    /// TLS, the default: make a cluster CA and certificates (DIR/tls: ca-cert.pem,
    /// ca-key.pem, client-cert.pem, client-key.pem; DIR/nodeN/tls for each node),
    /// require TLS with a client certificate on the NBD TCP ports (`nbds://`),
    /// mutual TLS between the nodes and HTTPS only on the admin APIs (prints the
    /// DROVE_CA to export for the CLI). The unix sockets stay plaintext. New
    /// clusters only; a restart keeps what it had.
    #[arg(long, conflicts_with = "no_tls")]
    tls: bool,
    /// No certificates: plaintext NBD on TCP (`nbd://`), between the nodes and on
    /// the admin APIs. For trying tools that speak no TLS, on a trusted host.
    #[arg(long)]
    no_tls: bool,
    /// Tokens, the default: ask every admin API request for one. Makes
    /// DIR/admin.token (a random admin token, mode 0600), starts every node with
    /// --admin-token-file on it, and prints the DROVE_TOKEN_FILE to export for the
    /// CLI. `drove token create` makes tokens with fewer rights. New clusters only;
    /// a restart keeps what it had.
    #[arg(long, conflicts_with = "no_auth")]
    auth: bool,
    /// No tokens: anyone who reaches an admin port may do anything.
    #[arg(long)]
    no_auth: bool,
}

#[derive(Args)]
pub struct DownArgs {
    /// The directory given to `drove up`.
    #[arg(long, default_value = "drove-cluster")]
    dir: PathBuf,
}

/// A free port below Linux's ephemeral range (32768 and up by default). A port
/// the kernel hands out for `:0` is ephemeral: between this check and the node's
/// bind, any outgoing connection on the host could take it. The port stays bound in
/// `held` until the plan is made, so one plan never picks a port twice.
fn free_port(held: &mut Vec<TcpListener>) -> Result<u16> {
    use std::hash::BuildHasher;
    for i in 0u32..2000 {
        let r = std::collections::hash_map::RandomState::new().hash_one((i, std::process::id()));
        let p = 10000 + (r % 22000) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", p)) {
            held.push(l);
            return Ok(p);
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").context("Cannot find a free port")?;
    let p = l.local_addr()?.port();
    held.push(l);
    Ok(p)
}

/// Whether node `n`'s last start failed because one of its ports was taken.
fn lost_a_port(n: &NodeEntry) -> bool {
    let text = std::fs::read(Path::new(&n.data).join("node.stderr")).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned();
    text.lines()
        .last()
        .is_some_and(|l| l.contains("Cannot listen on") && l.to_lowercase().contains("in use"))
}

/// New free TCP ports for node `n` (and node 1's admin address, which the others join).
fn repick_ports(n: &mut NodeEntry, first: bool, first_admin: &mut String) -> Result<()> {
    let mut held = Vec::new();
    let ports: Vec<u16> = (0..3)
        .map(|_| free_port(&mut held))
        .collect::<Result<_>>()?;
    n.admin = format!("127.0.0.1:{}", ports[0]);
    n.peer = format!("127.0.0.1:{}", ports[1]);
    if !n.witness {
        n.nbd_tcp = format!("nbd://127.0.0.1:{}", ports[2]);
    }
    if first {
        first_admin.clone_from(&n.admin);
    }
    Ok(())
}

fn port_free(p: u16) -> bool {
    TcpListener::bind(("127.0.0.1", p)).is_ok()
}

fn read_file(dir: &Path) -> Result<Option<ClusterFile>> {
    let path = dir.join("cluster.json");
    match std::fs::read(&path) {
        Ok(b) => Ok(Some(serde_json::from_slice(&b).with_context(|| {
            format!("{} is not a drove cluster file", path.display())
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("Cannot read {}", path.display())),
    }
}

/// The zone (from 0) of node `i` (from 0) of `nodes` in `zones` zones: round-robin,
/// or `grouped` (the first nodes fill z1, the next z2, ...; sizes differ by one at most).
fn zone_of(i: usize, nodes: usize, zones: usize, grouped: bool) -> usize {
    if grouped {
        i * zones / nodes
    } else {
        i % zones
    }
}

/// The layout of a new cluster: ports and zones.
fn plan(a: &UpArgs, dir: &Path) -> Result<Vec<NodeEntry>> {
    if a.nodes == 0 || a.nodes > 64 {
        bail!("--nodes must be 1 to 64");
    }
    let zones = a.zones.unwrap_or(a.nodes);
    if zones == 0 || zones > a.nodes {
        bail!("--zones must be 1 to the number of nodes ({})", a.nodes);
    }
    let mut out = Vec::new();
    // Ports picked for this plan stay bound until it is made (dropped at return).
    let mut held = Vec::new();
    let total = a.nodes + usize::from(a.witness);
    for i in 0..total {
        let witness = i == a.nodes;
        let ports: Vec<u16> = if a.base_port == 0 {
            (0..3)
                .map(|_| free_port(&mut held))
                .collect::<Result<_>>()?
        } else {
            let base = u32::from(a.base_port) + 10 * i as u32;
            if base + 2 > u32::from(u16::MAX) {
                bail!(
                    "--base-port {} leaves no room for {} nodes",
                    a.base_port,
                    total
                );
            }
            let ps: Vec<u16> = (0..3).map(|k| (base + k) as u16).collect();
            if let Some(p) = ps.iter().find(|&&p| !port_free(p)) {
                bail!("Port {p} is in use: pass another --base-port, or 0 for free ports");
            }
            ps
        };
        let data = dir.join(format!("node{}", i + 1));
        let zone = if witness {
            a.witness_zone
                .clone()
                .unwrap_or_else(|| format!("z{}", zones + 1))
        } else {
            format!("z{}", zone_of(i, a.nodes, zones, a.grouped) + 1)
        };
        out.push(NodeEntry {
            id: 0,
            zone,
            witness,
            admin: format!("127.0.0.1:{}", ports[0]),
            peer: format!("127.0.0.1:{}", ports[1]),
            // A witness serves no NBD.
            nbd_tcp: if witness {
                String::new()
            } else {
                format!("nbd://127.0.0.1:{}", ports[2])
            },
            nbd_unix: if witness {
                String::new()
            } else {
                abs(&data.join("nbd.sock"))
            },
            data: abs(&data),
            pid: 0,
            tls_dir: None,
            admin_token_file: None,
        });
    }
    Ok(out)
}

/// DIR/admin.token: a random admin API token (32 bytes from the system's CSPRNG,
/// hex), readable by its owner only; returns its absolute path.
fn make_admin_token(dir: &Path) -> Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| anyhow::anyhow!("No random bytes for a token: {e}"))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join("admin.token");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("Cannot create {}", path.display()))?;
    writeln!(f, "drove_{token}").with_context(|| format!("Cannot write {}", path.display()))?;
    Ok(abs(&path))
}

/// DIR/tls (the CA and a client certificate) and DIR/nodeN/tls (each node's
/// certificate, valid for 127.0.0.1 and localhost); sets each node's `tls_dir`.
fn make_certs(dir: &Path, nodes: &mut [NodeEntry]) -> Result<ClusterTls> {
    const DAYS: u32 = 3650;
    let tls = dir.join("tls");
    let ca = drove_tls::Ca::generate("drove-local-ca", DAYS)?;
    let [ca_cert, ca_key] = ca.write(&tls)?;
    let client = ca.issue_client("drove-client", DAYS)?;
    let [_, client_cert, client_key] = client.write_client(&ca, &tls)?;
    for (i, n) in nodes.iter_mut().enumerate() {
        // Made as the node would make it (its user's only; the node opens it to
        // its socket's group when it starts).
        private_fs::create_dir_all(Path::new(&n.data))
            .with_context(|| format!("Cannot create {}", n.data))?;
        let names = drove_tls::NodeNames {
            name: format!("node{}", i + 1),
            hosts: vec!["127.0.0.1".into(), "localhost".into()],
        };
        let node_dir = Path::new(&n.data).join("tls");
        ca.issue_node(&names, DAYS)?.write_node(&ca, &node_dir)?;
        n.tls_dir = Some(abs(&node_dir));
    }
    Ok(ClusterTls {
        dir: abs(&tls),
        ca_cert: abs(&ca_cert),
        ca_key: abs(&ca_key),
        client_cert: abs(&client_cert),
        client_key: abs(&client_key),
    })
}

fn abs(p: &Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

fn spawn(n: &NodeEntry, join: Option<&str>) -> Result<Child> {
    private_fs::create_dir_all(Path::new(&n.data))
        .with_context(|| format!("Cannot create {}", n.data))?;
    // The node writes and rotates node.log itself. Its stdout and stderr go to a
    // file of their own, which rotation never moves: what is printed before logging
    // starts (a bad flag) and a panic's default message land there.
    let out_path = Path::new(&n.data).join("node.stderr");
    let out = private_fs::options()
        .create(true)
        .append(true)
        .open(&out_path)
        .with_context(|| format!("Cannot open {}", out_path.display()))?;
    let log_path = Path::new(&n.data).join("node.log");
    let exe = std::env::current_exe().context("Cannot find the drove binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["node", "run", "--data", &n.data, "--zone", &n.zone])
        .args(["--listen", &n.admin, "--peer-listen", &n.peer])
        .arg("--log-file")
        .arg(&log_path);
    if n.witness {
        cmd.arg("--witness");
    } else {
        cmd.args(["--nbd-listen", n.nbd_tcp.trim_start_matches("nbd://")]);
    }
    if let Some(t) = &n.tls_dir {
        cmd.args(["--tls-dir", t]);
    }
    if let Some(t) = &n.admin_token_file {
        cmd.args(["--admin-token-file", t]);
    }
    if let Some(j) = join {
        cmd.args(["--join", j]);
    }
    // Not services of their own even when `drove up` runs in one: no readiness
    // messages to its systemd, and no copy of node.log in node.stderr (logging.rs).
    for var in ["NOTIFY_SOCKET", "INVOCATION_ID", "JOURNAL_STREAM"] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe; a new session keeps the node running
        // when the terminal that ran `drove up --detach` goes away.
        unsafe {
            cmd.pre_exec(|| {
                // Fails only when the child already leads a process group, which
                // a freshly forked one does not.
                let _ = rustix::process::setsid();
                Ok(())
            });
        }
    }
    cmd.spawn().context("Cannot start a node process")
}

/// The last lines of what node `n` printed (a failed start's reason), at most 1 KiB.
fn stderr_tail(n: &NodeEntry) -> String {
    let text = std::fs::read(Path::new(&n.data).join("node.stderr")).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(1024)..]).into_owned();
    text.lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Wait until node `n` answers and its map has `want` nodes; returns its status.
async fn wait_ready(ctx: &Ctx, n: &NodeEntry, want: usize, child: &mut Child) -> Result<Status> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(code)) = child.try_wait() {
            let tail = stderr_tail(n);
            bail!(
                "Node in {} exited ({code}) while starting; see {}/node.log and node.stderr{}",
                n.data,
                n.data,
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("; it said: {tail}")
                }
            );
        }
        if let Ok(s) = ctx.get_at::<Status>(&n.admin, "/api/status").await {
            if s.map.nodes.len() >= want
                && s.leader.is_some()
                && s.map.nodes.contains_key(&s.node_id)
            {
                return Ok(s);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "Node in {} did not become ready in 90 s; see {}/node.log and node.stderr",
                n.data,
                n.data
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn up(a: UpArgs, ctx: &Ctx) -> Result<()> {
    // At most 0755 whatever the umask: no one else may add or swap files in it.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&a.dir)
        .with_context(|| format!("Cannot create {}", a.dir.display()))?;
    let existing = read_file(&a.dir)?;
    if let Some(f) = &existing {
        if f.nodes.iter().all(|n| alive(n.pid)) {
            bail!(
                "The cluster of {} is running (all its {} nodes); stop it with `drove down --dir {}`",
                a.dir.display(),
                f.nodes.len(),
                a.dir.display()
            );
        }
    }
    let restart = existing.is_some();
    let (mut nodes, tls) = match existing {
        Some(f) => {
            if a.tls && f.tls.is_none() {
                bail!(
                    "--tls makes certificates for a new cluster; the one in {} has none",
                    a.dir.display()
                );
            }
            if a.auth && f.nodes.iter().all(|n| n.admin_token_file.is_none()) {
                bail!(
                    "--auth makes a token for a new cluster; the one in {} has none",
                    a.dir.display()
                );
            }
            if a.witness && !f.nodes.iter().any(|n| n.witness) {
                bail!(
                    "--witness adds a witness to a new cluster; the one in {} has none",
                    a.dir.display()
                );
            }
            if a.no_tls && f.tls.is_some() {
                bail!(
                    "--no-tls: the cluster in {} was made with certificates, and a restart \
                     keeps them; to try one without, use another --dir",
                    a.dir.display()
                );
            }
            if a.no_auth && f.nodes.iter().any(|n| n.admin_token_file.is_some()) {
                bail!(
                    "--no-auth: the cluster in {} was made with an admin token, and a restart \
                     keeps it; to try one without, use another --dir",
                    a.dir.display()
                );
            }
            let dead = f.nodes.iter().filter(|n| !alive(n.pid)).count();
            if dead == f.nodes.len() {
                eprintln!(
                    "Restarting the {} nodes of {}",
                    f.nodes.len(),
                    a.dir.display()
                );
            } else {
                eprintln!(
                    "Starting the {dead} stopped node(s) of {}; the other {} run and are left be",
                    a.dir.display(),
                    f.nodes.len() - dead
                );
            }
            (f.nodes, f.tls)
        }
        None => {
            let mut nodes = plan(&a, &a.dir)?;
            let tls = if !a.no_tls {
                Some(make_certs(&a.dir, &mut nodes)?)
            } else {
                None
            };
            if !a.no_auth {
                let file = make_admin_token(&a.dir)?;
                for n in &mut nodes {
                    n.admin_token_file = Some(file.clone());
                }
            }
            (nodes, tls)
        }
    };
    // The calls `drove up` makes carry this cluster's credentials, never the ones
    // of the environment (another cluster's): its token, if it has one; with
    // certificates HTTPS only, with the CA and client certificate it wrote;
    // without, plain HTTP.
    let token = match nodes.first().and_then(|n| n.admin_token_file.as_deref()) {
        Some(f) => Some(crate::client::read_token_file(Path::new(f))?),
        None => None,
    };
    let own = ctx.for_own_cluster(token, tls.as_ref().map(|t| Path::new(&t.dir)))?;
    let ctx = &own;
    // Nodes started so far; killed if start-up fails part-way, since no
    // cluster.json exists yet for `drove down` to find them.
    let mut children = Started(Vec::new());
    if let Err(e) = start_nodes(&a, ctx, restart, &mut nodes, &mut children.0).await {
        children.kill_all();
        return Err(e);
    }
    let file = ClusterFile { nodes, tls };
    let path = a.dir.join("cluster.json");
    private_fs::write(&path, &serde_json::to_vec_pretty(&file)?)
        .with_context(|| format!("Cannot write {}", path.display()))?;
    if ctx.json {
        print_json(&file)?;
    } else {
        print_table(&file);
        if let Some(t) = &file.tls {
            // The certificates go in the URI: libnbd 1.14's nbdinfo (Debian 12)
            // has no --tls-certificates option.
            println!(
                "\nNBD over TCP needs TLS and a client certificate, for example:\n  \
                 nbdinfo '{}/VDI?tls-certificates={}'",
                nbd_tcp_uri(&file, &file.nodes[0]),
                t.dir
            );
            println!(
                "  qemu: --object tls-creds-x509,id=tls0,endpoint=client,dir={}",
                t.dir
            );
        }
        println!("\nexport DROVE_CLUSTER={}", file.nodes[0].admin);
        if let Some(t) = &file.tls {
            println!("export DROVE_CA={}", t.dir);
        }
        if let Some(t) = &file.nodes[0].admin_token_file {
            println!("export DROVE_TOKEN_FILE={t}");
        }
    }
    if a.detach {
        return Ok(());
    }
    eprintln!("Running; press Ctrl-C to stop the cluster.");
    wait_for_stop().await;
    stop(&file).await;
    Ok(())
}

/// Children started by `up`; `kill_all` stops them when start-up fails.
struct Started(Vec<Child>);

impl Started {
    fn kill_all(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Start every node (all at once on a restart, else one by one joining node 1) and
/// wait until each is a member; fills in ids and pids.
async fn start_nodes(
    a: &UpArgs,
    ctx: &Ctx,
    restart: bool,
    nodes: &mut [NodeEntry],
    children: &mut Vec<Child>,
) -> Result<()> {
    if restart {
        // Every node has its metadata and its ports: the stopped ones start again
        // on them (all at once, since after `drove down` they must all run to
        // elect a leader); the ones still running are left be, so one killed node
        // comes back without stopping the others.
        let count = nodes.len();
        let stopped: Vec<usize> = (0..count).filter(|&i| !alive(nodes[i].pid)).collect();
        for &i in &stopped {
            children.push(spawn(&nodes[i], None)?);
        }
        for (&i, c) in stopped.iter().zip(children.iter_mut()) {
            let s = wait_ready(ctx, &nodes[i], count, c).await?;
            nodes[i].id = s.node_id.0;
            nodes[i].pid = c.id();
        }
    } else {
        let mut first_admin = nodes[0].admin.clone();
        // One at a time: each joins through node 1 and waits to be in the map.
        for (i, n) in nodes.iter_mut().enumerate() {
            // The ports were free when planned, but another process (a second
            // `drove up` on the host) may bind one before this node does: such a
            // node exits before it joins, so it is started again on new ports.
            let mut attempt = 0;
            let s = loop {
                let join = (i > 0).then_some(first_admin.as_str());
                children.push(spawn(n, join)?);
                let Some(c) = children.last_mut() else {
                    bail!("no node process to wait for");
                };
                match wait_ready(ctx, n, i + 1, c).await {
                    Ok(s) => break s,
                    Err(e) if a.base_port == 0 && attempt < 4 && lost_a_port(n) => {
                        attempt += 1;
                        let _ = children.pop();
                        eprintln!("node in {} lost a port to another process: {e:#}; retrying on new ports", n.data);
                        repick_ports(n, i == 0, &mut first_admin)?;
                    }
                    Err(e) => return Err(e),
                }
            };
            let Some(c) = children.last_mut() else {
                bail!("no node process to wait for");
            };
            n.id = s.node_id.0;
            n.pid = c.id();
            eprintln!(
                "{} {} up in zone {} ({})",
                if n.witness { "witness" } else { "node" },
                n.id,
                n.zone,
                n.admin
            );
        }
        // A witness holds no copy.
        let data_nodes = nodes.iter().filter(|n| !n.witness).count();
        let copies = a.copies.unwrap_or(data_nodes.min(3) as u8);
        let _: drove_daemon::api::Settings = ctx
            .post_at(
                &first_admin,
                "/api/settings",
                &drove_daemon::api::Settings {
                    default_copies: Some(copies),
                    ..Default::default()
                },
            )
            .await
            .context("Cannot set the default copies")?;
        wait_voters_placed(ctx, &first_admin).await?;
    }
    Ok(())
}

/// Whether the voters of a local cluster (every node up, default `--max-voters` 3)
/// are where the leader's vote keeper puts them: an odd number, 3 at most, in as
/// many distinct zones as they can be. Joiners come in as learners and are promoted
/// one at a time after `up` has seen them join; a cluster handed over before that
/// would lose its metadata with the loss of the one node voting.
fn voters_placed(s: &Status) -> bool {
    let nodes = s.map.nodes.len();
    let want = if nodes >= 3 { 3 } else { 1 };
    let v = drove_types::VoterZones::of(&s.map, &s.voters);
    let mut zones: Vec<&str> = s.map.nodes.values().map(|n| n.zone.as_str()).collect();
    zones.sort_unstable();
    zones.dedup();
    v.voters == want && v.zones.len() == want.min(zones.len())
}

/// Wait (up to 60 s) until [`voters_placed`] holds on the node at `admin`.
async fn wait_voters_placed(ctx: &Ctx, admin: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = ctx.get_at::<Status>(admin, "/api/status").await;
        match s {
            Ok(s) if voters_placed(&s) => return Ok(()),
            Ok(s) if Instant::now() > deadline => {
                let v = drove_types::VoterZones::of(&s.map, &s.voters);
                bail!(
                    "The metadata voters were not placed in 60 s: {}",
                    v.summary()
                );
            }
            Err(e) if Instant::now() > deadline => {
                return Err(e).context("The metadata voters were not placed in 60 s")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn wait_for_stop() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut t) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Node `n`'s NBD TCP port as a URI: `nbds://` when the cluster has certificates
/// (its ports then require TLS, as `vdi info` says), else `nbd://`.
fn nbd_tcp_uri(f: &ClusterFile, n: &NodeEntry) -> String {
    match f.tls {
        Some(_) => n.nbd_tcp.replacen("nbd://", "nbds://", 1),
        None => n.nbd_tcp.clone(),
    }
}

fn print_table(f: &ClusterFile) {
    let rows: Vec<Vec<String>> = f
        .nodes
        .iter()
        .map(|n| {
            vec![
                n.id.to_string(),
                if n.witness {
                    format!("{} (witness)", n.zone)
                } else {
                    n.zone.clone()
                },
                n.admin.clone(),
                if n.witness {
                    "-".to_string()
                } else {
                    nbd_tcp_uri(f, n)
                },
                if n.witness {
                    "-".to_string()
                } else {
                    n.nbd_unix.clone()
                },
                n.pid.to_string(),
            ]
        })
        .collect();
    table::print(
        &["ID", "ZONE", "ADMIN", "NBD TCP", "NBD UNIX", "PID"],
        &rows,
    );
}

pub async fn down(a: DownArgs, _ctx: &Ctx) -> Result<()> {
    let f = read_file(&a.dir)?
        .ok_or_else(|| anyhow!("No cluster in {} (no cluster.json)", a.dir.display()))?;
    let running = f.nodes.iter().filter(|n| alive(n.pid)).count();
    stop(&f).await;
    eprintln!("Stopped {running} node(s) of {}", a.dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status of nodes `(id, zone)` with `voters`.
    fn status_of(nodes: &[(u64, &str)], voters: &[u64]) -> Status {
        let mut map = drove_types::ClusterMap::default();
        for &(id, zone) in nodes {
            let id = drove_types::NodeId(id);
            map.nodes.insert(id, drove_types::NodeInfo::new(id, zone));
        }
        Status {
            cluster_id: drove_types::ClusterId(0),
            node_id: drove_types::NodeId(1),
            leader: Some(drove_types::NodeId(1)),
            term: 1,
            voters: voters.iter().map(|&v| drove_types::NodeId(v)).collect(),
            learners: Vec::new(),
            map,
            epoch_history: Vec::new(),
            maps_from: None,
            default_copies: 3,
            vdi_count: 0,
            quorum_age_ms: Some(0),
            noout: false,
            feature_level: drove_types::FEATURE_LEVEL,
        }
    }

    #[test]
    fn test_up_waits_for_an_odd_number_of_voters_one_per_zone_first() {
        let grouped = [(1, "z1"), (2, "z1"), (3, "z2"), (4, "z2"), (5, "z3")];
        assert!(!voters_placed(&status_of(&grouped, &[1])));
        assert!(!voters_placed(&status_of(&grouped, &[1, 3])), "two voters");
        assert!(
            !voters_placed(&status_of(&grouped, &[1, 2, 3])),
            "z3 has none"
        );
        assert!(voters_placed(&status_of(&grouped, &[1, 3, 5])));
        // Two zones: two voters share one; one node: it votes alone; two nodes: one.
        assert!(voters_placed(&status_of(&grouped[..4], &[1, 2, 3])));
        assert!(voters_placed(&status_of(&grouped[..1], &[1])));
        assert!(voters_placed(&status_of(&grouped[..2], &[1])));
        assert!(!voters_placed(&status_of(&grouped[..2], &[1, 2])));
    }

    fn entry(dir: &Path, stderr: &str) -> NodeEntry {
        std::fs::write(dir.join("node.stderr"), stderr).unwrap();
        NodeEntry {
            id: 0,
            zone: "z1".into(),
            witness: false,
            admin: "127.0.0.1:1".into(),
            peer: "127.0.0.1:2".into(),
            nbd_tcp: "nbd://127.0.0.1:3".into(),
            nbd_unix: String::new(),
            data: dir.display().to_string(),
            pid: 0,
            tls_dir: None,
            admin_token_file: None,
        }
    }

    #[test]
    fn grouped_zones_fill_one_after_another() {
        let zones = |n, z, g| (0..n).map(|i| zone_of(i, n, z, g)).collect::<Vec<_>>();
        assert_eq!(zones(6, 3, false), [0, 1, 2, 0, 1, 2]);
        assert_eq!(zones(6, 3, true), [0, 0, 1, 1, 2, 2]);
        assert_eq!(zones(5, 2, true), [0, 0, 0, 1, 1]);
        assert_eq!(zones(3, 3, true), [0, 1, 2]);
        assert_eq!(zones(4, 1, true), [0, 0, 0, 0]);
    }

    #[test]
    fn a_start_that_lost_a_port_is_told_from_other_failures() {
        let d = tempfile::tempdir().unwrap();
        let lost = "error: node failed: Cannot listen on 127.0.0.1:36745 for peers: \
                    Address already in use (os error 98)\n";
        let n = entry(d.path(), lost);
        assert!(lost_a_port(&n));
        assert!(stderr_tail(&n).contains("Cannot listen on 127.0.0.1:36745"));
        // Another reason, even after an earlier lost port in the same file, is not retried.
        let other = format!("{lost}error: node failed: the data directory is locked\n");
        let n = entry(d.path(), &other);
        assert!(!lost_a_port(&n));
        assert!(stderr_tail(&n).ends_with("the data directory is locked"));
        let n = entry(d.path(), "");
        assert!(!lost_a_port(&n));
        assert_eq!(stderr_tail(&n), "");
    }

    #[test]
    fn new_ports_are_free_and_move_the_join_address_of_node_one() {
        let d = tempfile::tempdir().unwrap();
        let mut n = entry(d.path(), "");
        let mut first = n.admin.clone();
        repick_ports(&mut n, true, &mut first).unwrap();
        assert_eq!(first, n.admin);
        for a in [
            n.admin.as_str(),
            n.peer.as_str(),
            n.nbd_tcp.trim_start_matches("nbd://"),
        ] {
            assert!(TcpListener::bind(a).is_ok(), "{a} is not free");
        }
        let before = first.clone();
        repick_ports(&mut n, false, &mut first).unwrap();
        assert_eq!(first, before);
    }
}
