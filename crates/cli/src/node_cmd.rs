//! `drove node run` (the daemon) and `drove node list`.
use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use drove_daemon::api::Status;
use drove_daemon::NodeConfig;
use drove_daemon::TlsMode;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::client::{print_json, Ctx};
use crate::table;

#[derive(Subcommand)]
pub enum NodeCmd {
    /// Run a node in the foreground until SIGTERM or Ctrl-C.
    Run(Box<RunArgs>),
    /// List the nodes of the cluster map.
    List,
    /// Space per node: its disk, free space, what drove stores there and how many
    /// objects (a node that does not answer is shown, not counted).
    Df,
    /// Take a node out of the cluster: its objects are copied to the others first
    /// (the drain, with progress), then it leaves the cluster map and the metadata
    /// membership, and its process can be stopped. A node that is down is not
    /// drained (its copies are stale): the others recover from current copies.
    Leave {
        /// Node id.
        id: u64,
        /// Return once the drain has started; the node stays in the cluster until
        /// `drove node leave ID` is run again and finishes.
        #[arg(long)]
        no_wait: bool,
    },
    /// Forget a node that is down for good (a dead host), without a drain: it leaves
    /// the cluster map and the metadata membership. Objects whose only up-to-date
    /// copies were on it become readable from the best copy left.
    Remove {
        /// Node id.
        id: u64,
    },
}

#[derive(Args)]
pub struct RunArgs {
    /// Read the settings from this TOML file: its keys are these flags' names in
    /// snake_case (data = "/var/lib/drove", zone = "dc1", tls_dir = ...); a flag
    /// given here overrides the file's key.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory (metadata, objects, DIR/nbd.sock).
    #[arg(long, required_unless_present = "config")]
    pub data: Option<PathBuf>,
    /// Failure domain of this node (rack, datacenter).
    #[arg(long, default_value = "z1")]
    pub zone: String,
    /// Admin HTTP API address (the CLI and other nodes use it).
    #[arg(long, default_value = "127.0.0.1:7000")]
    pub listen: SocketAddr,
    /// Peer data address [default: listen port + 1].
    #[arg(long)]
    pub peer_listen: Option<SocketAddr>,
    /// NBD TCP address [default: listen port + 2].
    #[arg(long)]
    pub nbd_listen: Option<SocketAddr>,
    /// Admin address of a member to join: host[:port] or http://host[:port] (port
    /// 7000 when left out). First start only; a restart rejoins by itself.
    #[arg(long)]
    pub join: Option<String>,
    /// Seconds a first start keeps trying to reach the --join address (saying so
    /// every few seconds) before it gives up and exits with an error.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub join_timeout: u64,
    /// Placement weight (relative capacity).
    #[arg(long, default_value_t = 100)]
    pub weight: u32,
    /// Run a witness: a metadata voter only, for a zone of its own (a third site
    /// beside two datacenters, so that either can be lost). It stores no objects
    /// (placement never puts a copy on it), binds no NBD port or socket, and is
    /// preferred as its zone's voter. The NBD flags and --weight do not go with it.
    #[arg(long, conflicts_with_all = [
        "weight", "nbd_listen", "nbd_tls", "nbd_socket_group", "nbd_handshake_timeout",
        "nbd_max_connections", "nbd_max_connections_per_client",
    ])]
    pub witness: bool,
    /// Metadata voters at most; nodes joining after that are learners.
    #[arg(long, default_value_t = 3)]
    pub max_voters: usize,
    /// Seconds a VDI write lock lasts without renewal: a gateway cut off from the
    /// metadata stops writing after this, and another node may take the VDI.
    #[arg(long, default_value_t = 15)]
    pub lock_lease: u64,
    /// Seconds between background scrubs of this node's objects (reads every object
    /// at the recovery rate limit, repairs rotten copies); 0 turns them off.
    #[arg(long, default_value_t = 86400)]
    pub scrub_every: u64,
    /// Space kept free on the data directory's file system for the node's own
    /// metadata (its Raft log), recovery record and log: once less is free, writes
    /// that need new space fail with ENOSPC (QEMU's werror=enospc pauses the VM)
    /// while reads, overwrites and deletes go on [default: 2 % of the file system,
    /// at least 8M, at most 1G].
    #[arg(long, value_name = "SIZE", value_parser = parse_reserve)]
    pub reserve_space: Option<u64>,
    /// Seconds an NBD client has from connecting to the end of option haggling
    /// (fractions allowed); one that stalls longer is disconnected.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub nbd_handshake_timeout: f64,
    /// NBD connections open at once (TCP and the unix socket); more are closed at
    /// accept and counted in drove_nbd_connections_refused.
    #[arg(long, default_value_t = 4096, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub nbd_max_connections: u32,
    /// NBD TCP connections open at once from one client address (a hypervisor
    /// attaching many disks over TCP needs one per disk, or a few with multi-conn).
    #[arg(long, default_value_t = 256, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub nbd_max_connections_per_client: u32,
    /// Admin API connections (--listen) open at once; more are closed at accept. A
    /// quarter of them is kept for loopback (127.0.0.1, ::1) and the cluster's
    /// nodes, which other addresses cannot take.
    #[arg(long, default_value_t = 1024, value_name = "N",
          value_parser = clap::value_parser!(u32).range(4..=1_000_000))]
    pub admin_max_connections: u32,
    /// Admin API connections open at once from one address other than loopback
    /// and the cluster's nodes.
    #[arg(long, default_value_t = 64, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub admin_max_connections_per_client: u32,
    /// Seconds an admin API connection has from connecting to the end of its
    /// first request's headers, the TLS handshake included (fractions allowed);
    /// one that takes longer is closed.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub admin_handshake_timeout: f64,
    /// Peer port connections (--peer-listen) open at once; more are closed at
    /// accept. A quarter of them is kept for the cluster's nodes and loopback.
    #[arg(long, default_value_t = 4096, value_name = "N",
          value_parser = clap::value_parser!(u32).range(4..=1_000_000))]
    pub peer_max_connections: u32,
    /// Peer port connections open at once from one address that is not a node of
    /// the cluster (a node joining, say).
    #[arg(long, default_value_t = 256, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub peer_max_connections_per_client: u32,
    /// Group of the NBD unix socket DIR/nbd.sock (a name or a number): the socket is
    /// mode 0660 and the data directory 0710 with this group, so its members (QEMU's
    /// user) may attach any VDI through the socket and read nothing else; the node's
    /// user must be a member [default: the node's own group].
    #[arg(long, value_name = "GROUP")]
    pub nbd_socket_group: Option<String>,
    /// Directory of this node's certificates: ca-cert.pem, server-cert.pem and
    /// server-key.pem (made by `drove cert node`, or `drove up`).
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// TLS on the NBD TCP port: off, allow (plaintext or STARTTLS) or require
    /// [default: require with --tls-dir, else off]. TLS clients must present a
    /// certificate signed by the cluster CA. The unix socket is always plaintext,
    /// protected by its file permissions.
    #[arg(long, value_enum, value_name = "MODE")]
    pub nbd_tls: Option<NbdTls>,
    /// Keep the peer port (objects, Raft, internal metadata calls) and the admin API
    /// in plaintext even with --tls-dir. By default a node with --tls-dir speaks
    /// mutual TLS on the peer port, letting in only nodes with a certificate of the
    /// same CA, and HTTPS only on the admin API (the CLI needs DROVE_CA); every node
    /// of a cluster must agree.
    #[arg(long)]
    pub no_peer_tls: bool,
    /// Ask every admin API request (--listen) for a bearer token; this file holds
    /// the node's own admin token (one line of text; `drove up --auth` makes a random
    /// one). Give every node of a cluster the same file: nodes ask each other's admin
    /// API with it. Tokens with fewer rights come from `drove token create`.
    /// Without it the admin API takes anyone: bind it to a private network.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// With --admin-token-file, still serve /metrics without a token (for a
    /// Prometheus that has none). Nothing else is left open.
    #[arg(long)]
    pub open_metrics: bool,
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// `--nbd-tls` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NbdTls {
    Off,
    Allow,
    Require,
}

/// The NBD TLS mode from the flags: require when certificates are given, unless told.
fn nbd_tls_mode(dir: Option<&std::path::Path>, flag: Option<NbdTls>) -> Result<TlsMode> {
    let mode = match flag {
        Some(NbdTls::Off) => TlsMode::Off,
        Some(NbdTls::Allow) => TlsMode::Allow,
        Some(NbdTls::Require) => TlsMode::Require,
        None if dir.is_some() => TlsMode::Require,
        None => TlsMode::Off,
    };
    if mode != TlsMode::Off && dir.is_none() {
        return Err(anyhow!(
            "--nbd-tls {} needs --tls-dir DIR (the node's certificates; see `drove cert node`)",
            if mode == TlsMode::Allow {
                "allow"
            } else {
                "require"
            }
        ));
    }
    Ok(mode)
}

fn offset(addr: SocketAddr, by: u16) -> Result<SocketAddr> {
    if addr.port() == 0 {
        return Ok(addr);
    }
    let port = addr.port().checked_add(by).ok_or_else(|| {
        anyhow!(
            "--listen port {} is too high to derive other ports",
            addr.port()
        )
    })?;
    Ok(SocketAddr::new(addr.ip(), port))
}

pub async fn run(cmd: NodeCmd, ctx: &Ctx) -> Result<()> {
    match cmd {
        NodeCmd::Run(a) => run_node(*a).await,
        NodeCmd::Df => crate::df_cmd::node_df(ctx).await,
        NodeCmd::List => {
            let s: Status = ctx.get("/api/status").await?;
            if ctx.json {
                return print_json(&nodes_json(&s)?);
            }
            print_nodes(&s);
            Ok(())
        }
        NodeCmd::Leave { id, no_wait } => crate::heal_cmd::leave(ctx, id, no_wait).await,
        NodeCmd::Remove { id } => crate::heal_cmd::remove(ctx, id).await,
    }
}

/// Keep the node's large buffers (4 MiB objects in flight: recovery copies, big
/// client I/Os) in the heap for reuse. By default glibc maps each one afresh and
/// gives the memory back on free, so every object copied paid for its page faults
/// and zeroing again: idle recovery ran at about 1500 MB/s with that, about 1670
/// with this (`bench/recovery.py`, four and five runs). Free memory beyond 64 MiB
/// at the top of a heap is still returned.
fn keep_large_buffers() {
    const MIB: libc::c_int = 1 << 20;
    // SAFETY: mallopt only sets allocator parameters; it takes effect for later
    // allocations and is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * MIB);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 * MIB);
    }
}

async fn run_node(a: RunArgs) -> Result<()> {
    keep_large_buffers();
    crate::logging::init(&a.log)?;
    let to_file = a.log.log_file.is_some();
    let res = run_node_logged(a).await;
    if let (Err(e), true) = (&res, to_file) {
        // main prints it to stderr; the log file must say why the node ended too.
        tracing::error!("node failed: {e:#}");
    }
    res
}

async fn run_node_logged(a: RunArgs) -> Result<()> {
    if a.weight == 0 {
        return Err(anyhow!("--weight must be at least 1"));
    }
    // The command line's conflicts are clap's; a config file's keys come one by one.
    if a.witness {
        for (flag, given) in [
            ("--nbd-listen", a.nbd_listen.is_some()),
            ("--nbd-tls", a.nbd_tls.is_some()),
            ("--nbd-socket-group", a.nbd_socket_group.is_some()),
        ] {
            if given {
                return Err(anyhow!(
                    "--witness serves no NBD: {flag} makes no sense with it"
                ));
            }
        }
    }
    let cfg = NodeConfig {
        data: a.data.context("--data DIR is needed")?,
        zone: a.zone,
        weight: a.weight,
        witness: a.witness,
        listen: a.listen,
        peer_listen: match a.peer_listen {
            Some(p) => p,
            None => offset(a.listen, 1)?,
        },
        nbd_listen: match a.nbd_listen {
            Some(p) => p,
            None => offset(a.listen, 2)?,
        },
        join: match &a.join {
            Some(j) => {
                Some(crate::addr::authority(j).map_err(|why| anyhow!("Bad --join '{j}': {why}"))?)
            }
            None => None,
        },
        max_voters: a.max_voters.max(1),
        join_timeout: std::time::Duration::from_secs(a.join_timeout.max(1)),
        lock_lease: std::time::Duration::from_secs(a.lock_lease.max(2)),
        scrub_every: (a.scrub_every > 0).then(|| std::time::Duration::from_secs(a.scrub_every)),
        reserve_space: a.reserve_space,
        nbd_handshake_timeout: handshake_timeout(a.nbd_handshake_timeout)?,
        nbd_max_connections: a.nbd_max_connections as usize,
        nbd_max_connections_per_client: a.nbd_max_connections_per_client as usize,
        nbd_socket_group: a.nbd_socket_group,
        admin_max_connections: a.admin_max_connections as usize,
        admin_max_connections_per_client: a.admin_max_connections_per_client as usize,
        admin_handshake_timeout: seconds(
            "--admin-handshake-timeout",
            a.admin_handshake_timeout,
            0.1,
            3600.0,
        )?,
        peer_max_connections: a.peer_max_connections as usize,
        peer_max_connections_per_client: a.peer_max_connections_per_client as usize,
        nbd_tls: nbd_tls_mode(a.tls_dir.as_deref(), a.nbd_tls)?,
        peer_tls: !a.no_peer_tls,
        tls_dir: a.tls_dir,
        admin_token: match &a.admin_token_file {
            Some(p) => Some(crate::client::read_token_file(p)?),
            None => None,
        },
        open_metrics: a.open_metrics,
    };
    drove_daemon::run(cfg, shutdown_signal())
        .await
        .context("node failed")?;
    Ok(())
}

/// `--reserve-space`: a size (K/M/G/T).
fn parse_reserve(s: &str) -> std::result::Result<u64, String> {
    drove_types::parse_size(s).map_err(|e| e.to_string())
}

/// `secs` as a duration, if within `min..=max` seconds; else an error naming `flag`.
fn seconds(flag: &str, secs: f64, min: f64, max: f64) -> Result<std::time::Duration> {
    if !(min..=max).contains(&secs) {
        return Err(anyhow!("Bad {flag} {secs}: use {min} to {max} seconds"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

fn handshake_timeout(secs: f64) -> Result<std::time::Duration> {
    if !(0.01..=3600.0).contains(&secs) {
        return Err(anyhow!(
            "Bad --nbd-handshake-timeout {secs}: use 0.01 to 3600 seconds"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// A node's part in the metadata, as `node list` shows it: its [`meta_role`], and
/// `witness` after it for a witness (`voter, witness`).
fn meta_shown(s: &Status, n: &drove_types::NodeInfo) -> String {
    let role = meta_role(s, n.id);
    if n.witness {
        format!("{role}, witness")
    } else {
        role.to_string()
    }
}

/// A node's part in the metadata: `leader`, `voter` or `learner`.
fn meta_role(s: &Status, id: drove_types::NodeId) -> &'static str {
    if s.leader == Some(id) {
        "leader"
    } else if s.voters.contains(&id) {
        "voter"
    } else {
        "learner"
    }
}

/// `s`, or `-` when empty (a witness has no NBD address).
fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".to_string()
    } else {
        s.to_string()
    }
}

/// `node list --json`: the cluster map (a witness has `witness: true`), each node
/// with its `meta` role, and
/// `voter_zones`: the metadata voters by zone (`{"z1": [1], "z2": [3]}`).
fn nodes_json(s: &Status) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(&s.map)?;
    for n in s.map.nodes.values() {
        v["nodes"][n.id.0.to_string()]["meta"] = meta_role(s, n.id).into();
    }
    let zones = drove_types::VoterZones::of(&s.map, &s.voters);
    v["voter_zones"] = serde_json::to_value(&zones.zones)?;
    Ok(v)
}

/// A node's build for tables: its version and the feature level it knows
/// ("0.1.0 L2"; "old L1" from a build from before levels).
pub fn build_shown(n: &drove_types::NodeInfo) -> String {
    let v = if n.version.is_empty() {
        "old"
    } else {
        n.version.as_str()
    };
    format!("{v} L{}", n.feature_level())
}

/// The nodes as a table (ZONE and META: each voter's zone), then one line of where
/// the metadata voters are: `metadata: 3 voters in 3 zones: z1 (1), z2 (3), z3 (5)`.
pub fn print_nodes(s: &Status) {
    let rows: Vec<Vec<String>> = s
        .map
        .nodes
        .values()
        .map(|n| {
            vec![
                n.id.to_string(),
                n.zone.clone(),
                format!("{:?}", n.state).to_lowercase(),
                meta_shown(s, n),
                n.admin_addr.clone(),
                dash(&n.nbd_addr),
                dash(&n.nbd_socket),
                build_shown(n),
            ]
        })
        .collect();
    table::print(
        &[
            "ID", "ZONE", "STATE", "META", "ADMIN", "NBD", "SOCKET", "BUILD",
        ],
        &rows,
    );
    println!(
        "metadata: {}",
        drove_types::VoterZones::of(&s.map, &s.voters).summary()
    );
}
