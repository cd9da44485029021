//! What one run of the paper's experiment measures: the four workloads, the
//! systems (drove under each requested write policy, then the baseline), and the
//! scale (zones, nodes, parallel clients, delay, sizes). Parsing of the
//! command-line values (`1,4,8,16`, `10ms`, `20s`, `sync,zone-sync`) lives here
//! too, so the CLI only forwards strings.
use anyhow::{bail, Context, Result};
use drove_types::WritePolicy;
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
    /// A drove cluster whose VDIs use the sync write policy, each client attached
    /// through a node of its own zone. Named "drove" (as before there was a second
    /// policy), so older results.csv files still parse.
    Drove,
    /// The same cluster, each client's zone-sync VDI (home zone = the client's).
    DroveZoneSync,
    /// One qemu-nbd box in zone 1, reached through the WAN by clients elsewhere.
    Baseline,
}

impl System {
    /// Every system, in the order they run at every point (a run measures the
    /// requested drove systems and the baseline: [`PaperConfig::systems`]).
    pub const ALL: [System; 3] = [System::Drove, System::DroveZoneSync, System::Baseline];

    /// Short name used in files (the `system` column of results.csv).
    pub fn name(self) -> &'static str {
        match self {
            System::Drove => "drove",
            System::DroveZoneSync => "drove-zone-sync",
            System::Baseline => "baseline",
        }
    }

    /// Name in results.md's tables, which says the policy of both drove systems.
    pub fn label(self) -> &'static str {
        match self {
            System::Drove => "drove sync",
            System::DroveZoneSync => "drove zone-sync",
            System::Baseline => "baseline",
        }
    }

    /// The system named `s`.
    pub fn parse(s: &str) -> Option<System> {
        System::ALL.into_iter().find(|x| x.name() == s)
    }

    /// The drove system whose VDIs use `policy`.
    pub fn drove(policy: WritePolicy) -> System {
        match policy {
            WritePolicy::Sync => System::Drove,
            WritePolicy::ZoneSync => System::DroveZoneSync,
        }
    }

    /// The write policy of a drove system's VDIs; `None` for the baseline.
    pub fn policy(self) -> Option<WritePolicy> {
        match self {
            System::Drove => Some(WritePolicy::Sync),
            System::DroveZoneSync => Some(WritePolicy::ZoneSync),
            System::Baseline => None,
        }
    }

    /// Whether this is drove (either policy).
    pub fn is_drove(self) -> bool {
        self.policy().is_some()
    }

    /// Name of the drove VDI of client `i` (0-based): `c{i}` under sync, `z{i}`
    /// under zone-sync, so both sets live in one cluster; `None` for the baseline.
    pub fn vdi_name(self, i: usize) -> Option<String> {
        match self {
            System::Drove => Some(format!("c{i}")),
            System::DroveZoneSync => Some(format!("z{i}")),
            System::Baseline => None,
        }
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
    /// Write policies measured, one drove system each, in [`System::ALL`] order
    /// (each VDI's home zone is its client's, the zone it is prefilled from).
    pub policies: Vec<WritePolicy>,
    /// Operations measured, in [`Op::ALL`] order (all four unless `--ops` chose).
    pub ops: Vec<Op>,
    /// The proxy server that emulates the WAN.
    pub wan_proxy: crate::toxiproxy::WanProxyKind,
    /// fio queue depth of every client.
    pub iodepth: u32,
    /// Output directory.
    pub out: PathBuf,
    /// The `drove` binary that starts the cluster.
    pub drove_bin: PathBuf,
    /// The command line, quoted in results.md.
    pub command_line: String,
    /// Seconds without heartbeats before the cluster marks a node down
    /// (`drove cluster config --down-after`); `None` keeps the node default.
    pub down_after_secs: Option<f64>,
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

    /// Bytes the disks take: every client's disk on each drove policy, `copies`
    /// times, and once more for the baseline (all nodes share this host's disk).
    pub fn disk_bytes(&self) -> u64 {
        let per_copy = self.clients() as u64 * self.size;
        per_copy * (self.policies.len() as u64 * u64::from(self.copies) + 1)
    }

    /// The two delay phases: none, then `delay_ms`.
    pub fn delays(&self) -> [u64; 2] {
        [0, self.delay_ms]
    }

    /// The systems measured at every point, in the order they run: drove with
    /// each requested policy, then the baseline.
    pub fn systems(&self) -> Vec<System> {
        let mut v: Vec<System> = self.policies.iter().map(|&p| System::drove(p)).collect();
        v.push(System::Baseline);
        v
    }

    /// The drove systems measured (every system but the baseline).
    pub fn drove_systems(&self) -> Vec<System> {
        self.policies.iter().map(|&p| System::drove(p)).collect()
    }

    /// Points measured: systems x delays x X x operations.
    pub fn points(&self) -> usize {
        self.systems().len() * self.delays().len() * self.parallel.len() * self.ops.len()
    }

    /// The policies as results.md states them: `sync, zone-sync`.
    pub fn policies_text(&self) -> String {
        self.policies
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
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
        check_policies(&self.policies)?;
        Ok(())
    }
}

#[cfg(test)]
impl PaperConfig {
    /// The quick run's scale (2 zones x 2 nodes, X = 1, 2, 10 ms) with `policies`,
    /// for tests of what is computed from a configuration.
    pub(crate) fn example(policies: Vec<WritePolicy>) -> Self {
        PaperConfig {
            zones: 2,
            nodes_per_zone: 2,
            parallel: vec![1, 2],
            delay_ms: 10,
            size: 16 << 20,
            runtime_secs: 2,
            repeat: 1,
            copies: 3,
            policies,
            ops: Op::ALL.to_vec(),
            wan_proxy: crate::toxiproxy::WanProxyKind::Builtin,
            iodepth: DEFAULT_IODEPTH,
            out: PathBuf::from("out"),
            drove_bin: PathBuf::from("drove"),
            command_line: "drove bench paper --quick".to_string(),
            down_after_secs: None,
        }
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

/// Parse `--policy`: `sync`, `zone-sync` or both, comma-separated. Unknown names,
/// a policy given twice and an empty list are refused; the result is in
/// [`System::ALL`] order whatever order they were given in, so the tables of two
/// runs line up.
pub fn parse_policies(s: &str) -> Result<Vec<WritePolicy>> {
    if s.trim().is_empty() {
        bail!("--policy is empty: use sync, zone-sync or sync,zone-sync");
    }
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            bail!("Bad --policy '{s}': an empty name (use sync, zone-sync or sync,zone-sync)");
        }
        let Ok(p) = part.parse::<WritePolicy>() else {
            bail!(
                "Unknown write policy '{part}' in --policy: use sync, zone-sync or sync,zone-sync"
            );
        };
        v.push(p);
    }
    check_policies(&v)?;
    v.sort_by_key(|&p| System::drove(p));
    Ok(v)
}

/// Parse `block-write,small-read` into operations in [`Op::ALL`] order, none twice.
pub fn parse_ops(s: &str) -> Result<Vec<Op>> {
    let names = Op::ALL.map(Op::name).join(", ");
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim) {
        let Some(op) = Op::parse(part) else {
            bail!("Unknown operation '{part}' in --ops: use one or more of {names}");
        };
        if v.contains(&op) {
            bail!("--ops names {part} twice");
        }
        v.push(op);
    }
    v.sort_by_key(|op| Op::ALL.iter().position(|o| o == op));
    Ok(v)
}

/// At least one policy, none twice.
fn check_policies(v: &[WritePolicy]) -> Result<()> {
    if v.is_empty() {
        bail!("--policy is empty: use sync, zone-sync or sync,zone-sync");
    }
    for (i, p) in v.iter().enumerate() {
        if v[..i].contains(p) {
            bail!("--policy names {p} twice");
        }
    }
    Ok(())
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
    fn test_disk_bytes_count_every_copy_and_the_baseline() {
        let mut c = PaperConfig::example(vec![WritePolicy::Sync, WritePolicy::ZoneSync]);
        c.parallel = vec![1, 4, 8, 16];
        c.size = 256 << 20;
        // The default run: 16 disks of 256 MiB, 2 policies x 3 copies + baseline.
        assert_eq!(c.disk_bytes(), 16 * (256 << 20) * 7);
        c.policies = vec![WritePolicy::Sync];
        assert_eq!(c.disk_bytes(), 16 * (256 << 20) * 4);
    }

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
        for system in System::ALL {
            assert_eq!(System::parse(system.name()), Some(system));
        }
        // results.csv of runs before the second policy call sync's system "drove".
        assert_eq!(System::parse("drove"), Some(System::Drove));
        assert_eq!(
            System::parse("drove-zone-sync"),
            Some(System::DroveZoneSync)
        );
        assert_eq!(Op::parse("nope"), None);
    }

    #[test]
    fn test_parse_ops_keeps_the_papers_order_and_refuses_unknown_names() {
        assert_eq!(
            parse_ops("small-read, block-write").unwrap(),
            vec![Op::BlockWrite, Op::SmallRead]
        );
        assert_eq!(
            parse_ops("block-write,block-read,small-write,small-read").unwrap(),
            Op::ALL
        );
        let e = parse_ops("block-write,nope").unwrap_err().to_string();
        assert!(e.contains("Unknown operation 'nope'"), "{e}");
        assert!(parse_ops("").is_err());
        assert!(parse_ops("small-read,small-read").is_err());
    }

    #[test]
    fn test_parse_policies_accepts_one_or_both_in_system_order() {
        use WritePolicy::{Sync, ZoneSync};
        assert_eq!(parse_policies("sync").unwrap(), vec![Sync]);
        assert_eq!(parse_policies("zone-sync").unwrap(), vec![ZoneSync]);
        assert_eq!(
            parse_policies("sync,zone-sync").unwrap(),
            vec![Sync, ZoneSync]
        );
        assert_eq!(
            parse_policies(" zone-sync , sync ").unwrap(),
            vec![Sync, ZoneSync]
        );
    }

    #[test]
    fn test_parse_policies_refuses_unknown_duplicate_and_empty() {
        let err = |s: &str| format!("{:#}", parse_policies(s).unwrap_err());
        assert!(
            err("async").contains("Unknown write policy 'async'"),
            "{}",
            err("async")
        );
        assert!(err("sync,Sync").contains("'Sync'"), "{}", err("sync,Sync"));
        assert!(
            err("sync,sync").contains("sync twice"),
            "{}",
            err("sync,sync")
        );
        assert!(
            err("zone-sync,sync,zone-sync").contains("zone-sync twice"),
            "{}",
            err("zone-sync,sync,zone-sync")
        );
        assert!(err("").contains("empty"), "{}", err(""));
        assert!(err(" ").contains("empty"), "{}", err(" "));
        assert!(err("sync,").contains("empty name"), "{}", err("sync,"));
        assert!(
            err(",zone-sync").contains("empty name"),
            "{}",
            err(",zone-sync")
        );
    }

    fn cfg(policies: Vec<WritePolicy>, parallel: Vec<usize>) -> PaperConfig {
        PaperConfig {
            parallel,
            ..PaperConfig::example(policies)
        }
    }

    #[test]
    fn test_systems_and_points_count_every_requested_policy() {
        use WritePolicy::{Sync, ZoneSync};
        let one = cfg(vec![Sync], vec![1, 2]);
        assert_eq!(one.systems(), vec![System::Drove, System::Baseline]);
        assert_eq!(one.drove_systems(), vec![System::Drove]);
        // 2 systems x 2 delays x 2 X x 4 operations: the quick run's 32 points.
        assert_eq!(one.points(), 32);
        let zs = cfg(vec![ZoneSync], vec![1, 2]);
        assert_eq!(zs.systems(), vec![System::DroveZoneSync, System::Baseline]);
        assert_eq!(zs.points(), 32);
        let both = cfg(vec![Sync, ZoneSync], vec![1, 4, 8, 16]);
        assert_eq!(
            both.systems(),
            vec![System::Drove, System::DroveZoneSync, System::Baseline]
        );
        assert_eq!(both.policies_text(), "sync, zone-sync");
        assert_eq!(both.points(), 3 * 2 * 4 * 4);
        assert!(both.validate().is_ok());
    }

    #[test]
    fn test_validate_refuses_no_policy_or_one_twice() {
        let none = cfg(vec![], vec![1, 2]);
        assert!(format!("{:#}", none.validate().unwrap_err()).contains("empty"));
        let twice = cfg(vec![WritePolicy::Sync, WritePolicy::Sync], vec![1, 2]);
        assert!(format!("{:#}", twice.validate().unwrap_err()).contains("twice"));
    }

    #[test]
    fn test_drove_systems_map_to_policies_and_vdi_names() {
        for p in [WritePolicy::Sync, WritePolicy::ZoneSync] {
            let s = System::drove(p);
            assert!(s.is_drove());
            assert_eq!(s.policy(), Some(p));
        }
        assert!(!System::Baseline.is_drove());
        assert_eq!(System::Drove.vdi_name(3).as_deref(), Some("c3"));
        assert_eq!(System::DroveZoneSync.vdi_name(3).as_deref(), Some("z3"));
        assert_eq!(System::Baseline.vdi_name(3), None);
    }
}
