//! `drove bench paper`: the paper's experiment (ParallelismImpactRatio,
//! LatencyImpactRatio, transfer efficiency) against drove and a centralized
//! qemu-nbd baseline over an emulated WAN. The work is in the drove-paperbench
//! crate; this file turns arguments into its configuration, runs it on a blocking
//! thread, and turns Ctrl-C / SIGTERM into its cancel flag so that everything it
//! started is stopped before the command exits.
use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use drove_paperbench::config::{
    parse_duration_ms, parse_ops, parse_parallel, parse_policies, Op, DEFAULT_IODEPTH,
};
use drove_paperbench::toxiproxy::WanProxyKind;
use drove_paperbench::{Cancel, PaperConfig};
use std::io::Write;
use std::path::PathBuf;

use crate::client::{print_json, Ctx};

#[derive(Subcommand)]
pub enum BenchCmd {
    /// The paper's experiment: drove (with each write policy asked for) and a
    /// centralized qemu-nbd in zone 1, with and without a WAN delay between zones;
    /// writes results.csv, results.md and charts.
    Paper(PaperArgs),
    /// The control plane: VDI creates, snapshots, clones, deletes, lists, write-lock
    /// acquire+release and NBD attach cycles, at 1, 32 and 256 in flight, against the
    /// metadata leader and a follower of a 3-node cluster it starts (or --cluster-dir);
    /// ops/s with p50/p99 latency, written to results.md and results.json.
    Meta(crate::bench_meta::MetaArgs),
    /// An emulated WAN for the benchmarks and tests: TCP proxies that delay each
    /// direction by a fixed time and may cap its bandwidth, driven over HTTP on
    /// --api with the part of toxiproxy's REST API `drove bench paper` uses (POST
    /// /proxies, POST /proxies/NAME/toxics, DELETE /proxies/NAME/toxics/T, GET
    /// /metrics). Runs until killed.
    WanProxy(WanProxyArgs),
}

#[derive(Args)]
pub struct WanProxyArgs {
    /// Where the API listens: a loopback address and port.
    #[arg(long, default_value = "127.0.0.1:8474")]
    api: std::net::SocketAddr,
}

#[derive(Args)]
pub struct PaperArgs {
    /// Zones ("datacenters") [default: 4; 2 with --quick].
    #[arg(long)]
    zones: Option<usize>,
    /// drove nodes per zone [default: 2].
    #[arg(long)]
    nodes_per_zone: Option<usize>,
    /// Clients at once, comma-separated; 1 is always added [default: 1,4,8,16; 1,2 with --quick].
    #[arg(long)]
    parallel: Option<String>,
    /// One-way delay between zones, e.g. 10ms [default: 10ms].
    #[arg(long)]
    delay: Option<String>,
    /// Size of each client's disk, e.g. 256M [default: 256M; 16M with --quick].
    #[arg(long)]
    size: Option<String>,
    /// Time each fio run lasts, e.g. 20s [default: 20s; 2s with --quick].
    #[arg(long)]
    runtime: Option<String>,
    /// Repeats of every point; the median is kept [default: 3; 1 with --quick].
    #[arg(long)]
    repeat: Option<usize>,
    /// Output directory [default: bench/results/paper-DATE].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write policies of drove's VDIs, comma-separated: sync, zone-sync or both; each is
    /// measured as its own system beside the baseline, in one cluster (see docs/wan.md)
    /// [default: sync,zone-sync; sync with --quick].
    #[arg(long, value_name = "sync,zone-sync")]
    policy: Option<String>,
    /// Operations measured, comma-separated: block-write, block-read, small-write,
    /// small-read [default: all four]. Fewer make a shorter run for one question; the
    /// paper's table then shows "n/a" for the rest.
    #[arg(long, value_name = "OPS")]
    ops: Option<String>,
    /// The proxy that emulates the WAN: builtin (`drove bench wan-proxy`, lighter) or
    /// toxiproxy (installed with go install) [default: builtin].
    #[arg(long, value_name = "builtin|toxiproxy")]
    wan_proxy: Option<String>,
    /// A small version for the test suite (2 zones x 2 nodes, X = 1,2, 16M, 2 s, 1
    /// repeat, policy sync); explicit options still win.
    #[arg(long)]
    quick: bool,
    /// Seconds without heartbeats before the cluster marks a node down, e.g. 15
    /// [default: 15; the node default (5) with --quick]. The full run puts 8 nodes,
    /// up to 16 fio clients, 16 qemu-nbd and the WAN proxy on one host: a node
    /// starved of CPU for 5 s is slow, not gone, and marking it down measures
    /// recovery instead of I/O.
    #[arg(long, value_name = "SECS")]
    down_after: Option<f64>,
}

fn config(a: PaperArgs) -> Result<PaperConfig> {
    let q = a.quick;
    let zones = a.zones.unwrap_or(if q { 2 } else { 4 });
    let nodes_per_zone = a.nodes_per_zone.unwrap_or(2);
    let parallel =
        parse_parallel(
            a.parallel
                .as_deref()
                .unwrap_or(if q { "1,2" } else { "1,4,8,16" }),
        )?;
    let delay_ms = parse_duration_ms(a.delay.as_deref().unwrap_or("10ms"), 1)?;
    let size =
        drove_types::parse_size(a.size.as_deref().unwrap_or(if q { "16M" } else { "256M" }))?;
    let runtime_ms = parse_duration_ms(
        a.runtime.as_deref().unwrap_or(if q { "2s" } else { "20s" }),
        1000,
    )?;
    if runtime_ms % 1000 != 0 {
        return Err(anyhow!("--runtime must be whole seconds"));
    }
    let out = a.out.unwrap_or_else(|| {
        PathBuf::from("bench/results")
            .join(format!("paper-{}", drove_paperbench::report::date_stamp()))
    });
    let nodes = zones * nodes_per_zone;
    let cfg = PaperConfig {
        zones,
        nodes_per_zone,
        parallel,
        delay_ms,
        size,
        runtime_secs: runtime_ms / 1000,
        repeat: a.repeat.unwrap_or(if q { 1 } else { 3 }),
        copies: nodes.min(3) as u8,
        policies: parse_policies(a.policy.as_deref().unwrap_or(if q {
            "sync"
        } else {
            "sync,zone-sync"
        }))?,
        ops: match a.ops.as_deref() {
            Some(s) => parse_ops(s)?,
            None => Op::ALL.to_vec(),
        },
        wan_proxy: WanProxyKind::parse(a.wan_proxy.as_deref().unwrap_or("builtin"))?,
        iodepth: DEFAULT_IODEPTH,
        out: std::path::absolute(&out).unwrap_or(out),
        drove_bin: std::env::current_exe().context("Cannot find the drove binary")?,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        down_after_secs: match a.down_after {
            Some(s) if !(0.5..=3600.0).contains(&s) => {
                return Err(anyhow!("--down-after must be between 0.5 and 3600 seconds"))
            }
            Some(s) => Some(s),
            None if q => None,
            None => Some(15.0),
        },
    };
    cfg.validate()?;
    Ok(cfg)
}

pub async fn run(cmd: BenchCmd, ctx: &Ctx) -> Result<()> {
    let a = match cmd {
        BenchCmd::Paper(a) => a,
        BenchCmd::Meta(a) => return crate::bench_meta::run(a, ctx.json).await,
        BenchCmd::WanProxy(a) => {
            return drove_wanproxy::run(a.api)
                .await
                .with_context(|| format!("The WAN proxy cannot serve its API on {}", a.api));
        }
    };
    let cfg = config(a)?;
    // Not eprintln!: SIGPIPE is ignored here, and a closed stderr must not panic.
    let _ = writeln!(
        std::io::stderr(),
        "drove bench paper: {} zones x {} nodes, write policies {}, X = {:?}, delay {} ms, {} per disk, {} s x {} per point ({} points); output in {}",
        cfg.zones,
        cfg.nodes_per_zone,
        cfg.policies_text(),
        cfg.parallel,
        cfg.delay_ms,
        drove_types::format_size(cfg.size),
        cfg.runtime_secs,
        cfg.repeat,
        cfg.points(),
        cfg.out.display()
    );
    let cancel = Cancel::new();
    let c2 = cancel.clone();
    let cfg2 = cfg.clone();
    let mut task = tokio::task::spawn_blocking(move || drove_paperbench::run(&cfg2, &c2));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("Cannot watch SIGTERM")?;
    let joined = tokio::select! {
        r = &mut task => r,
        _ = tokio::signal::ctrl_c() => {
            let _ = writeln!(std::io::stderr(), "\ninterrupted: stopping everything the benchmark started...");
            cancel.set();
            task.await
        }
        _ = term.recv() => {
            let _ = writeln!(std::io::stderr(), "\nterminated: stopping everything the benchmark started...");
            cancel.set();
            task.await
        }
    };
    let report = joined.map_err(|e| anyhow!("The benchmark thread failed: {e}"))??;
    // Everything the run started is stopped: a closed stdout may now end this
    // process quietly, as it ends every other command (see main.rs).
    crate::restore_sigpipe();
    if ctx.json {
        return print_json(&report);
    }
    println!("results: {}", cfg.out.join("results.md").display());
    println!("         {}", cfg.out.join("results.csv").display());
    for c in &report.charts {
        println!("         {}", c.display());
    }
    if let Some(why) = &report.charts_note {
        println!("charts skipped: {why}");
    }
    let bound = report.points.iter().filter(|p| p.cpu_bound).count();
    if bound > 0 {
        println!(
            "{bound} of {} points were CPU-bound (machine > 90% busy): see results.md",
            report.points.len()
        );
    }
    println!("took {:.0} s", report.elapsed_secs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use drove_paperbench::System;
    use drove_types::WritePolicy::{Sync, ZoneSync};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: PaperArgs,
    }

    fn cfg(args: &[&str]) -> Result<PaperConfig> {
        let cli = Cli::try_parse_from(std::iter::once("paper").chain(args.iter().copied()))?;
        config(cli.a)
    }

    #[test]
    fn test_policy_defaults_to_both_and_quick_to_sync() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.policies, vec![Sync, ZoneSync]);
        assert_eq!(
            c.systems(),
            vec![System::Drove, System::DroveZoneSync, System::Baseline]
        );
        let q = cfg(&["--quick"]).unwrap();
        assert_eq!(q.policies, vec![Sync]);
        assert_eq!(q.points(), 32);
        let both = cfg(&["--quick", "--policy", "sync,zone-sync"]).unwrap();
        assert_eq!(both.policies, vec![Sync, ZoneSync]);
        assert_eq!(both.points(), 48);
        let zs = cfg(&["--policy", "zone-sync"]).unwrap();
        assert_eq!(zs.systems(), vec![System::DroveZoneSync, System::Baseline]);
    }

    #[test]
    fn test_bad_policy_lists_are_errors() {
        for bad in ["", "async", "sync,sync", "sync,,zone-sync"] {
            let e = cfg(&["--quick", "--policy", bad]).unwrap_err();
            assert!(format!("{e:#}").contains("policy"), "{bad}: {e:#}");
        }
    }
}
