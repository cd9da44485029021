//! `drove vdi iostat`: the live I/O of every VDI, cluster-wide, like `iostat` or
//! `top`. Every node counts the requests of the VDIs attached through it; this asks
//! them all (through any node, `GET /api/iostat`) once per interval and shows what
//! happened in between: requests and bytes per second, and latency quantiles (the
//! upper bound of a doubling bucket, so at most twice the true value), and the
//! time requests waited for the VDI's QoS limits (`QOS-MS/S`: milliseconds of
//! waiting per second, summed over the requests).
use anyhow::Result;
use clap::Args;
use drove_daemon::api::ClusterIostat;
use drove_daemon::iostat::by_vdi;
use drove_metrics::VdiIoSample;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::client::Ctx;
use crate::table;

#[derive(Args)]
pub struct IostatArgs {
    /// Show only these VDIs (by default every VDI with I/O in the interval).
    pub names: Vec<String>,
    /// Order of the rows: iops (reads + writes per second), bytes (per second),
    /// latency (the worse p99 of reads and writes) or name.
    #[arg(long, default_value = "iops", value_parser = ["iops", "bytes", "latency", "name"])]
    pub sort: String,
    /// Seconds between refreshes, 0.2 to 3600 (fractions allowed).
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub interval: f64,
    /// Stop after this many refreshes (by default run until interrupted).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Show at most this many VDIs per refresh.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub top: usize,
}

/// One VDI over one interval.
#[derive(Debug, Serialize)]
struct Row {
    vdi: String,
    read_iops: f64,
    write_iops: f64,
    read_bytes_per_s: f64,
    write_bytes_per_s: f64,
    read_p50_ms: Option<f64>,
    read_p99_ms: Option<f64>,
    write_p50_ms: Option<f64>,
    write_p99_ms: Option<f64>,
    flushes_per_s: f64,
    /// Milliseconds requests waited for the VDI's QoS limits, per second of the
    /// interval, summed over the requests (1000: one request waiting all along).
    throttled_ms_per_s: f64,
    errors: u64,
}

/// One interval, as `--json` prints it (one object per line).
#[derive(Debug, Serialize)]
struct Interval {
    unix_ms: u64,
    interval_s: f64,
    nodes: usize,
    unreachable: Vec<drove_types::NodeId>,
    vdis: Vec<Row>,
}

fn ms(q: Option<f64>) -> Option<f64> {
    q.map(|s| s * 1e3)
}

fn row(d: &VdiIoSample, secs: f64) -> Row {
    Row {
        vdi: d.vdi.clone(),
        read_iops: d.read.ops as f64 / secs,
        write_iops: d.write.ops as f64 / secs,
        read_bytes_per_s: d.read.bytes as f64 / secs,
        write_bytes_per_s: d.write.bytes as f64 / secs,
        read_p50_ms: ms(d.read.quantile(0.5)),
        read_p99_ms: ms(d.read.quantile(0.99)),
        write_p50_ms: ms(d.write.quantile(0.5)),
        write_p99_ms: ms(d.write.quantile(0.99)),
        flushes_per_s: d.flushes as f64 / secs,
        throttled_ms_per_s: d.throttled_us as f64 / 1e3 / secs,
        errors: d.read.errors + d.write.errors,
    }
}

fn check(a: &IostatArgs) -> Result<()> {
    if !(0.2..=3600.0).contains(&a.interval) {
        return Err(crate::fail::invalid(format!(
            "Bad --interval {}: use 0.2 to 3600 seconds",
            a.interval
        )));
    }
    if a.count == Some(0) {
        return Err(crate::fail::invalid("Bad --count 0: use 1 or more"));
    }
    if a.top == 0 {
        return Err(crate::fail::invalid("Bad --top 0: use 1 or more"));
    }
    Ok(())
}

/// What each VDI did between two gatherings, `secs` apart, as sorted rows.
fn rows(
    a: &IostatArgs,
    before: &BTreeMap<String, VdiIoSample>,
    now: &BTreeMap<String, VdiIoSample>,
    secs: f64,
) -> Vec<Row> {
    let mut out: Vec<Row> = now
        .values()
        .filter(|s| a.names.is_empty() || a.names.contains(&s.vdi))
        .map(|s| match before.get(&s.vdi) {
            Some(b) => s.since(b),
            None => s.clone(),
        })
        .filter(|d| !a.names.is_empty() || d.ops() > 0 || d.flushes > 0)
        .map(|d| row(&d, secs))
        .collect();
    // Named VDIs with no counters anywhere yet are shown idle.
    for n in &a.names {
        if !out.iter().any(|r| &r.vdi == n) {
            out.push(row(
                &VdiIoSample {
                    vdi: n.clone(),
                    ..Default::default()
                },
                secs,
            ));
        }
    }
    let worst = |r: &Row| {
        r.read_p99_ms
            .unwrap_or(0.0)
            .max(r.write_p99_ms.unwrap_or(0.0))
    };
    match a.sort.as_str() {
        "bytes" => out.sort_by(|x, y| {
            (y.read_bytes_per_s + y.write_bytes_per_s)
                .total_cmp(&(x.read_bytes_per_s + x.write_bytes_per_s))
        }),
        "latency" => out.sort_by(|x, y| worst(y).total_cmp(&worst(x))),
        "name" => out.sort_by(|x, y| x.vdi.cmp(&y.vdi)),
        _ => out
            .sort_by(|x, y| (y.read_iops + y.write_iops).total_cmp(&(x.read_iops + x.write_iops))),
    }
    out.truncate(a.top);
    out
}

fn rate(bytes_per_s: f64) -> String {
    format!("{}/s", drove_types::format_size(bytes_per_s.round() as u64))
}

fn latency(q: Option<f64>) -> String {
    match q {
        None => "-".to_string(),
        Some(v) if v.is_infinite() => ">34s".to_string(),
        Some(v) if v < 1.0 => format!("{v:.3}"),
        Some(v) => format!("{v:.0}"),
    }
}

fn print_table(i: &Interval, clear: bool) {
    if clear {
        // Home and clear, as top does.
        print!("\x1b[H\x1b[2J");
    }
    println!(
        "every {:.1} s; {} node(s) answered{}; latency in ms (bucket bounds)",
        i.interval_s,
        i.nodes,
        if i.unreachable.is_empty() {
            String::new()
        } else {
            format!(
                ", not: {}",
                i.unreachable
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    let rows: Vec<Vec<String>> = i
        .vdis
        .iter()
        .map(|r| {
            vec![
                r.vdi.clone(),
                format!("{:.0}", r.read_iops),
                format!("{:.0}", r.write_iops),
                rate(r.read_bytes_per_s),
                rate(r.write_bytes_per_s),
                latency(r.read_p50_ms),
                latency(r.read_p99_ms),
                latency(r.write_p50_ms),
                latency(r.write_p99_ms),
                format!("{:.0}", r.flushes_per_s),
                format!("{:.0}", r.throttled_ms_per_s),
                r.errors.to_string(),
            ]
        })
        .collect();
    table::print(
        &[
            "VDI", "READ/S", "WRITE/S", "READ", "WRITE", "R-P50", "R-P99", "W-P50", "W-P99",
            "FLUSH/S", "QOS-MS/S", "ERRORS",
        ],
        &rows,
    );
    if i.vdis.is_empty() {
        println!("(no I/O)");
    }
    if !clear {
        println!();
    }
    let _ = std::io::stdout().flush();
}

/// `drove vdi iostat`.
pub async fn run(a: IostatArgs, ctx: &Ctx) -> Result<()> {
    check(&a)?;
    let interval = Duration::from_secs_f64(a.interval);
    let clear = !ctx.json && std::io::stdout().is_terminal();
    let mut before: ClusterIostat = ctx.get("/api/iostat").await?;
    let mut before_at = Instant::now();
    let mut shown = 0;
    loop {
        tokio::time::sleep_until((before_at + interval).into()).await;
        let now: ClusterIostat = ctx.get("/api/iostat").await?;
        let now_at = Instant::now();
        let secs = (now_at - before_at).as_secs_f64().max(1e-3);
        let i = Interval {
            unix_ms: drove_types::clock::unix_ms(),
            interval_s: secs,
            nodes: now.nodes.len(),
            unreachable: now.unreachable.clone(),
            vdis: rows(&a, &by_vdi(&before), &by_vdi(&now), secs),
        };
        if ctx.json {
            println!("{}", serde_json::to_string(&i)?);
        } else {
            print_table(&i, clear);
        }
        shown += 1;
        if a.count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        (before, before_at) = (now, now_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: IostatArgs,
    }

    fn args(v: &[&str]) -> IostatArgs {
        Cli::parse_from(std::iter::once("iostat").chain(v.iter().copied())).a
    }

    fn sample(vdi: &str, reads: u64, writes: u64) -> VdiIoSample {
        let t = drove_metrics::VdiIoTable::default();
        let io = t.vdi(vdi);
        for _ in 0..reads {
            io.read(4096, 1e-4, true);
        }
        for _ in 0..writes {
            io.write(65536, 2e-3, true);
        }
        t.samples().remove(0)
    }

    fn map(v: Vec<VdiIoSample>) -> BTreeMap<String, VdiIoSample> {
        v.into_iter().map(|s| (s.vdi.clone(), s)).collect()
    }

    #[test]
    fn test_rows_are_rates_over_the_interval_sorted_and_idle_vdis_left_out() {
        let before = map(vec![
            sample("a", 10, 0),
            sample("b", 0, 0),
            sample("c", 5, 5),
        ]);
        let now = map(vec![
            sample("a", 30, 0),
            sample("b", 0, 4),
            sample("c", 5, 5),
        ]);
        let r = rows(&args(&[]), &before, &now, 2.0);
        assert_eq!(
            r.iter()
                .map(|r| (r.vdi.as_str(), r.read_iops, r.write_iops))
                .collect::<Vec<_>>(),
            [("a", 10.0, 0.0), ("b", 0.0, 2.0)]
        );
        assert_eq!(r[1].write_bytes_per_s, 131072.0);
        assert_eq!(r[1].write_p99_ms, Some(2.048));
        let r = rows(&args(&["--sort", "bytes"]), &before, &now, 2.0);
        assert_eq!(r[0].vdi, "b");
        let r = rows(&args(&["c", "zz"]), &before, &now, 2.0);
        assert_eq!(
            r.iter().map(|r| r.vdi.as_str()).collect::<Vec<_>>(),
            ["c", "zz"]
        );
    }

    #[test]
    fn test_bad_arguments_are_refused_with_the_range() {
        for (v, want) in [
            (
                &["--interval", "0"][..],
                "Bad --interval 0: use 0.2 to 3600",
            ),
            (&["--count", "0"], "Bad --count 0"),
            (&["--top", "0"], "Bad --top 0"),
        ] {
            let e = check(&args(v)).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
