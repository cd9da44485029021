//! What one run of the paper's experiment measures: the four workloads, the two
//! systems, and the scale (zones, nodes, parallel clients, delay, sizes). Parsing
//! of the command-line values (`1,4,8,16`, `10ms`, `20s`) lives here too, so the CLI
//! only forwards strings.
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::PathBuf;

/// One of the paper's four operations, as a fio job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Sequential writes of 1 MiB blocks.
    BlockWrite,
    /// Sequential reads of 1 MiB blocks.
    BlockRead,
    /// Random writes of 4 KiB.
    SmallWrite,
    /// Random reads of 4 KiB.
    SmallRead,
}

impl Op {
    /// The four operations in the order they run (each read follows a write).
    pub const ALL: [Op; 4] = [Op::BlockWrite, Op::BlockRead, Op::SmallWrite, Op::SmallRead];

    /// Short name used in files and tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::BlockWrite => "block-write",
            Op::BlockRead => "block-read",
            Op::SmallWrite => "small-write",
            Op::SmallRead => "small-read",
        }
    }

    /// Human description with the fio pattern.
    pub fn label(self) -> &'static str {
        match self {
            Op::BlockWrite => "block write (1M sequential)",
            Op::BlockRead => "block read (1M sequential)",
            Op::SmallWrite => "small write (4k random)",
            Op::SmallRead => "small read (4k random)",
        }
    }

    /// fio's `rw=` value.
    pub fn fio_rw(self) -> &'static str {
        match self {
            Op::BlockWrite => "write",
            Op::BlockRead => "read",
            Op::SmallWrite => "randwrite",
            Op::SmallRead => "randread",
        }
    }

    /// fio's `bs=` value.
    pub fn block_size(self) -> &'static str {
        match self {
            Op::BlockWrite | Op::BlockRead => "1M",
            Op::SmallWrite | Op::SmallRead => "4k",
        }
    }

    /// Whether clients write (transfer efficiency is defined for writes).
    pub fn is_write(self) -> bool {
        matches!(self, Op::BlockWrite | Op::SmallWrite)
    }

    /// The operation named `s` (as [`Op::name`] gives it).
    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// The system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// A drove cluster, each client attached through a node of its own zone.
    Drove,
    /// One qemu-nbd box in zone 1, reached through the WAN by clients elsewhere.
    Baseline,
}

impl System {
    /// Both systems, in the order they run at every point.
    pub const ALL: [System; 2] = [System::Drove, System::Baseline];

    /// Short name used in files and tables.
    pub fn name(self) -> &'static str {
        match self {
            System::Drove => "drove",
            System::Baseline => "baseline",
        }
    }

    /// The system named `s`.
    pub fn parse(s: &str) -> Option<System> {
        System::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// Everything one run needs.
#[derive(Clone, Debug)]
pub struct PaperConfig {
    /// Zones ("datacenters").
    pub zones: usize,
    /// drove nodes in each zone.
    pub nodes_per_zone: usize,
    /// Numbers of clients running at once; always contains 1, sorted.
    pub parallel: Vec<usize>,
    /// One-way delay between zones in the delayed phase, in milliseconds.
    pub delay_ms: u64,
    /// Bytes per client disk (and per fio job).
    pub size: u64,
    /// Seconds each fio job runs.
    pub runtime_secs: u64,
    /// Repetitions of every point; the median is kept.
    pub repeat: usize,
    /// Copies of every drove VDI.
    pub copies: u8,
    /// Write policy of every drove VDI (`sync` or `zone-sync`; each VDI's home zone
    /// is its client's, the zone it is prefilled from).
    pub policy: drove_types::WritePolicy,
    /// fio queue depth of every client.
    pub iodepth: u32,
    /// Output directory.
    pub out: PathBuf,
    /// The `drove` binary that starts the cluster.
    pub drove_bin: PathBuf,
    /// The command line, quoted in results.md.
    pub command_line: String,
}

/// The paper's scale, quoted next to ours.
pub const PAPER_SCALE: &str =
    "4 datacenters x 22 nodes = 88 nodes, X = 10, 20 and 44 VMs at once, 10 ms one-way delay";

/// fio queue depth used for every client: a VM with a few requests in flight.
pub const DEFAULT_IODEPTH: u32 = 4;

impl PaperConfig {
    /// Total drove nodes.
    pub fn nodes(&self) -> usize {
        self.zones * self.nodes_per_zone
    }

    /// Number of clients (disks) prepared: the largest X.
    pub fn clients(&self) -> usize {
        self.parallel.iter().copied().max().unwrap_or(1)
    }

    /// The two delay phases: none, then `delay_ms`.
    pub fn delays(&self) -> [u64; 2] {
        [0, self.delay_ms]
    }

    /// Points measured: systems x delays x X x operations.
    pub fn points(&self) -> usize {
        2 * 2 * self.parallel.len() * Op::ALL.len()
    }

    /// Refuse a configuration that cannot give the indexes.
    pub fn validate(&self) -> Result<()> {
        if self.zones < 2 {
            bail!("--zones must be at least 2 (the delay is between zones)");
        }
        if self.nodes_per_zone == 0 {
            bail!("--nodes-per-zone must be at least 1");
        }
        if self.nodes() > 64 {
            bail!("At most 64 nodes (zones x nodes-per-zone)");
        }
        if self.parallel.first() != Some(&1) {
            bail!("--parallel must contain 1 (ParallelismImpactRatio divides by X=1)");
        }
        if self.clients() > 256 {
            bail!("--parallel: at most 256 clients");
        }
        if self.delay_ms == 0 {
            bail!("--delay must be more than 0 ms (LatencyImpactRatio compares with 0 ms)");
        }
        if self.size < 1 << 20 {
            bail!("--size must be at least 1M");
        }
        if self.runtime_secs == 0 {
            bail!("--runtime must be at least 1s");
        }
        if self.repeat == 0 {
            bail!("--repeat must be at least 1");
        }
        if self.copies == 0 {
            bail!("copies must be at least 1");
        }
        Ok(())
    }
}

/// Parse `1,4,8,16` into a sorted list without duplicates that always holds 1.
pub fn parse_parallel(s: &str) -> Result<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let x: usize = part
            .parse()
            .with_context(|| format!("Bad --parallel value '{part}': use numbers like 1,4,8"))?;
        if x == 0 {
            bail!("--parallel values must be at least 1");
        }
        v.push(x);
    }
    if v.is_empty() {
        bail!("--parallel is empty");
    }
    v.push(1);
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Parse a duration such as `10ms`, `2s`, `1m` into milliseconds; a bare number is
/// taken in `bare_unit_ms` milliseconds.
pub fn parse_duration_ms(s: &str, bare_unit_ms: u64) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .with_context(|| format!("Bad duration '{s}': use e.g. 10ms, 20s or 1m"))?;
    let mult = match unit.trim() {
        "" => bare_unit_ms,
        "ms" => 1,
        "s" => 1000,
        "m" | "min" => 60_000,
        other => bail!("Bad duration unit '{other}' in '{s}': use ms, s or m"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("Duration '{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_parallel_sorts_dedups_and_adds_one() {
        assert_eq!(parse_parallel("8,4,4,16").unwrap(), vec![1, 4, 8, 16]);
        assert_eq!(parse_parallel("1, 2").unwrap(), vec![1, 2]);
        assert!(parse_parallel("0,2").is_err());
        assert!(parse_parallel("a").is_err());
        assert!(parse_parallel("").is_err());
    }

    #[test]
    fn test_parse_duration_units() {
        assert_eq!(parse_duration_ms("10ms", 1).unwrap(), 10);
        assert_eq!(parse_duration_ms("20s", 1).unwrap(), 20_000);
        assert_eq!(parse_duration_ms("2", 1000).unwrap(), 2000);
        assert_eq!(parse_duration_ms("1m", 1).unwrap(), 60_000);
        assert!(parse_duration_ms("10h", 1).is_err());
        assert!(parse_duration_ms("ms", 1).is_err());
    }

    #[test]
    fn test_op_names_round_trip() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
        assert_eq!(System::parse("baseline"), Some(System::Baseline));
        assert_eq!(Op::parse("nope"), None);
    }
}
