//! `drove`: one binary for the node daemon and every admin command. This file only
//! parses arguments and dispatches; each subcommand group lives in its own module.
mod access_cmd;
mod addr;
mod bench_cmd;
mod bench_meta;
mod cert_cmd;
mod client;
mod cluster_cmd;
mod df_cmd;
mod diff_cmd;
mod diff_format;
mod diff_import;
mod diff_plan;
mod fail;
mod gen_cmd;
mod heal_cmd;
mod iostat_cmd;
mod lineage_cmd;
mod lock_cmd;
mod log_file;
mod log_limit;
mod logging;
mod move_cmd;
mod nbd_client;
mod nbd_target;
mod node_cmd;
mod node_config;
mod policy_cmd;
mod procs;
mod qemu_img;
mod qos_cmd;
mod sim_cmd;
mod stream;
mod sync_cmd;
mod table;
mod token_cmd;
mod transfer;
mod up;
mod upgrade_cmd;
mod vdi_cmd;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::io::Write;

/// Replicated, WAN-aware block storage for virtual-machine disks.
#[derive(Parser)]
#[command(name = "drove", version, about, long_about = None)]
struct Cli {
    /// Admin address of any node: host, host:port, http://host[:port] or [IPv6]:port
    /// (port 7000 when left out); defaults to $DROVE_CLUSTER, then 127.0.0.1:7000.
    #[arg(long, global = true, env = "DROVE_CLUSTER")]
    cluster: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Send this command's first change with this request id (32 hex digits) instead
    /// of a random one. A change is applied at most once per id, so when a command
    /// ended with "outcome unknown", running it again with the id it printed tells
    /// the outcome without acting twice.
    #[arg(long, global = true, value_parser = parse_request_id)]
    request_id: Option<drove_daemon::api::ClientRequestId>,
    /// File holding the admin API token to send (nodes started with
    /// --admin-token-file ask for one); DROVE_TOKEN, the secret itself, goes first.
    #[arg(long, global = true, env = "DROVE_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// The cluster's CA certificate: the admin API is then reached over HTTPS (nodes
    /// with TLS certificates speak nothing else). A PEM file, or a directory holding
    /// ca-cert.pem and, when present, client-cert.pem and client-key.pem, sent to the
    /// node (`drove up` prints its DIR/tls).
    #[arg(long, global = true, env = "DROVE_CA", value_name = "FILE|DIR")]
    ca: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run or inspect nodes.
    #[command(subcommand)]
    Node(node_cmd::NodeCmd),
    /// Start a local cluster of N nodes on 127.0.0.1, for trying drove out.
    Up(up::UpArgs),
    /// Stop a cluster started with `drove up --detach`.
    Down(up::DownArgs),
    /// Cluster-wide status and settings.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCmd),
    /// Create, list, inspect, resize and delete virtual disk images.
    #[command(subcommand)]
    Vdi(vdi_cmd::VdiCmd),
    /// Benchmarks: `bench paper` runs the paper's experiment against drove and a
    /// centralized baseline over an emulated WAN.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCmd),
    /// The deterministic simulator: drove's own code on a simulated cluster, for
    /// seeded fault runs (`sim faults`) and the paper at its scale (`sim paper`).
    #[command(subcommand)]
    Sim(sim_cmd::SimCmd),
    /// Make a cluster CA, node certificates and client certificates (TLS).
    #[command(subcommand)]
    Cert(cert_cmd::CertCmd),
    /// Tokens of the admin API, with a role each (nodes run with --admin-token-file).
    #[command(subcommand)]
    Token(token_cmd::TokenCmd),
    /// Write man pages or shell completions (for packaging).
    #[command(subcommand, hide = true)]
    Generate(gen_cmd::GenerateCmd),
}

/// Let a closed stdout or stderr end this process the way it ends `ls` or `grep`:
/// quietly, by SIGPIPE. Rust ignores SIGPIPE before `main`, so a write to a closed
/// pipe (`drove cluster status | head -1`) returns EPIPE and `println!` panics
/// (exit 101). Restoring the default action covers every print at once, clap's and
/// the error line's included, where handling EPIPE would need every print site to
/// be fallible. Not for `drove node run`: the daemon writes to sockets that peers
/// may close at any time, and one dead connection must never kill it (it keeps
/// SIGPIPE ignored and handles EPIPE as an error). Not for `drove bench` while it
/// runs: it owns child processes (nodes, proxies, fio) that only its own cleanup
/// stops; it restores the default itself once they are gone (`bench_cmd`).
fn sigpipe_ends_quietly(cmd: &Cmd) -> bool {
    !matches!(cmd, Cmd::Node(node_cmd::NodeCmd::Run(_)) | Cmd::Bench(_))
}

/// Whether the command writes a disk image to stdout (`vdi export NAME -`).
fn image_on_stdout(cmd: &Cmd) -> bool {
    matches!(cmd, Cmd::Vdi(vdi_cmd::VdiCmd::Export(a)) if a.file.as_os_str() == "-")
}

/// Restore SIGPIPE's default action (end the process) for the rest of its life.
pub fn restore_sigpipe() {
    // SAFETY: SIG_DFL installs no handler code (nothing runs in signal context); it
    // only changes what a later SIGPIPE does.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The cluster address and where it came from (clap knows whether the flag or the
/// variable gave it), parsed; a bad one is an error only for commands that use it.
fn cluster_addr(m: &clap::ArgMatches, given: Option<&str>) -> Result<addr::ClusterAddr, String> {
    let source = match m.value_source("cluster") {
        Some(ValueSource::EnvVariable) => addr::Source::Env,
        _ => addr::Source::Flag,
    };
    match given {
        Some(g) => addr::ClusterAddr::parse(g, source),
        None => addr::ClusterAddr::parse(addr::DEFAULT_CLUSTER, addr::Source::Default),
    }
}

fn main() {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `node run --config FILE`: the file's settings under the command line's.
    let config = match &mut cli.cmd {
        Cmd::Node(node_cmd::NodeCmd::Run(a)) => node_config::apply(a, &matches),
        _ => Ok(()),
    };
    if sigpipe_ends_quietly(&cli.cmd) {
        restore_sigpipe();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    // Errors as JSON on stdout, except where stdout carries a disk image.
    let json = cli.json && !image_on_stdout(&cli.cmd);
    let token = client::token_from(std::env::var("DROVE_TOKEN").ok(), cli.token_file.as_deref());
    let ctx = client::Ctx::new(
        cluster_addr(&matches, cli.cluster.as_deref()),
        cli.json,
        cli.request_id,
        token,
        cli.ca.as_deref(),
    );
    let res = rt.block_on(async move {
        config?;
        match cli.cmd {
            Cmd::Node(c) => node_cmd::run(c, &ctx).await,
            Cmd::Up(a) => up::up(a, &ctx).await,
            Cmd::Down(a) => up::down(a, &ctx).await,
            Cmd::Cluster(c) => cluster_cmd::run(c, &ctx).await,
            Cmd::Vdi(c) => vdi_cmd::run(c, &ctx).await,
            Cmd::Bench(c) => bench_cmd::run(c, &ctx).await,
            Cmd::Sim(c) => sim_cmd::run(c, &ctx).await,
            Cmd::Cert(c) => cert_cmd::run(c, &ctx).await,
            Cmd::Token(c) => token_cmd::run(c, &ctx).await,
            Cmd::Generate(c) => gen_cmd::run(c),
        }
    });
    if let Err(e) = res {
        if json {
            print_json_error(&e);
        }
        if let Some(u) = e
            .chain()
            .find_map(|c| c.downcast_ref::<client::OutcomeUnknown>())
        {
            // Not "error": it may have happened.
            let _ = writeln!(std::io::stderr(), "outcome unknown: {u}");
            std::process::exit(3);
        }
        // Not eprintln!: under `node run` and `bench` SIGPIPE is ignored, and a
        // closed stderr must not turn the error into a panic.
        let _ = writeln!(std::io::stderr(), "error: {e:#}");
        std::process::exit(1);
    }
}

/// Under `--json`, a failed command prints `{"error": {"kind": ..., "message": ...}}`
/// on stdout (and the usual line on stderr): `kind` as [`fail::kind`] finds it.
fn print_json_error(e: &anyhow::Error) {
    let unknown = e
        .chain()
        .find_map(|c| c.downcast_ref::<client::OutcomeUnknown>());
    let kind = fail::kind(e);
    let mut err = serde_json::json!({ "kind": kind, "message": format!("{e:#}") });
    if let Some(u) = unknown {
        err["request_id"] = serde_json::Value::String(u.request_id.to_string());
    }
    let text = serde_json::json!({ "error": err }).to_string();
    let _ = writeln!(std::io::stdout(), "{text}");
}

fn parse_request_id(s: &str) -> Result<drove_daemon::api::ClientRequestId, String> {
    drove_daemon::api::ClientRequestId::parse(s)
}
