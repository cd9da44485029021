//! Machine load during a run, from the first line of /proc/stat. The whole
//! experiment (nodes, proxies, qemu-nbd, fio) shares this machine's cores; when they
//! are nearly all busy, a throughput ratio measures the CPU, not the storage
//! system, and the point is flagged "CPU-bound".
use anyhow::{anyhow, Context, Result};

/// Cumulative CPU time counters (clock ticks) of all cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSample {
    /// Ticks spent doing work (user, nice, system, irq, softirq, steal).
    pub busy: u64,
    /// All ticks, idle and iowait included.
    pub total: u64,
}

/// Parse the aggregate `cpu` line of /proc/stat.
pub fn parse_proc_stat(text: &str) -> Option<CpuSample> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]; guest time
    // is already inside user and nice, so only the first eight fields count.
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let idle = get(3) + get(4);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    Some(CpuSample {
        busy,
        total: busy + idle,
    })
}

/// Read /proc/stat now.
pub fn sample() -> Result<CpuSample> {
    let text = std::fs::read_to_string("/proc/stat").context("Cannot read /proc/stat")?;
    parse_proc_stat(&text).ok_or_else(|| anyhow!("/proc/stat has no 'cpu' line"))
}

/// Busy share (0..1) between two samples; `None` if no time passed.
pub fn busy_fraction(before: CpuSample, after: CpuSample) -> Option<f64> {
    let total = after.total.checked_sub(before.total)?;
    let busy = after.busy.checked_sub(before.busy)?;
    if total == 0 {
        return None;
    }
    Some(busy as f64 / total as f64)
}

/// CPU ticks (user + system) a process has used, from /proc/PID/stat; with
/// `children`, also those of its exited and reaped children (how the fio clients,
/// reaped by the harness, are counted). `None` if the process is gone.
pub fn process_ticks(pid: u32, children: bool) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_pid_stat(&stat, children)
}

/// Parse the time fields of a /proc/PID/stat line (see [`process_ticks`]).
pub fn parse_pid_stat(stat: &str, children: bool) -> Option<u64> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime, stime, cutime, cstime are fields 14..=17.
    let get = |field: usize| f.get(field - 3).and_then(|v| v.parse::<u64>().ok());
    let own = get(14)? + get(15)?;
    Some(if children {
        own + get(16)? + get(17)?
    } else {
        own
    })
}

/// Ticks used so far by the harness (with its reaped children) and by `pids`.
pub fn experiment_ticks(pids: &[u32]) -> u64 {
    let me = process_ticks(std::process::id(), true).unwrap_or(0);
    me + pids
        .iter()
        .filter_map(|&p| process_ticks(p, false))
        .sum::<u64>()
}

/// Number of cores, for the report.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_busy_fraction_from_proc_stat() {
        let a = parse_proc_stat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5\n").unwrap();
        assert_eq!(
            a,
            CpuSample {
                busy: 150,
                total: 1000
            }
        );
        let b = parse_proc_stat("cpu  280 0 60 810 50 0 0 0 0 0\n").unwrap();
        // 190 busy of 200 ticks: 95%.
        assert_eq!(busy_fraction(a, b), Some(0.95));
        assert_eq!(busy_fraction(a, a), None);
        assert_eq!(busy_fraction(b, a), None);
        assert!(parse_proc_stat("intr 1 2\n").is_none());
    }

    #[test]
    fn test_pid_stat_fields() {
        let line = "1234 (my (odd) cmd) S 1 2 3 4 5 6 7 8 9 10 11 22 33 44 55 20 0 1 0";
        assert_eq!(parse_pid_stat(line, false), Some(11 + 22));
        assert_eq!(parse_pid_stat(line, true), Some(11 + 22 + 33 + 44));
        assert_eq!(parse_pid_stat("garbage", false), None);
        assert!(process_ticks(std::process::id(), true).is_some());
    }

    #[test]
    fn test_sample_reads_this_machine() {
        let s = sample().unwrap();
        assert!(s.total >= s.busy && s.total > 0);
    }
}
