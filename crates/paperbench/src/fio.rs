//! fio as the client of every disk: the command line of one client (a "VM") and the
//! parsing of fio's `--output-format=json`. fio's NBD engine prints a line such as
//! "fio: connected to NBD server" before the JSON, so the parser starts at the first
//! `{` and reads one JSON value.
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::config::Op;

/// What one fio job reports.
#[derive(Clone, Debug, PartialEq)]
pub struct FioJob {
    /// The job name (`--name`).
    pub name: String,
    /// fio's error code (0 when the job succeeded).
    pub error: i64,
    /// Read bandwidth, bytes per second.
    pub read_bw_bytes: f64,
    /// Write bandwidth, bytes per second.
    pub write_bw_bytes: f64,
    /// Bytes read.
    pub read_io_bytes: u64,
    /// Bytes written.
    pub write_io_bytes: u64,
    /// Read I/Os per second.
    pub read_iops: f64,
    /// Write I/Os per second.
    pub write_iops: f64,
}

impl FioJob {
    /// Throughput of `op`'s direction in MB/s (10^6 bytes per second).
    pub fn mbps(&self, op: Op) -> f64 {
        if op.is_write() {
            self.write_bw_bytes / 1e6
        } else {
            self.read_bw_bytes / 1e6
        }
    }

    /// Bytes moved in `op`'s direction.
    pub fn io_bytes(&self, op: Op) -> u64 {
        if op.is_write() {
            self.write_io_bytes
        } else {
            self.read_io_bytes
        }
    }
}

fn num(side: &Value, key: &str) -> Result<f64> {
    side.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| anyhow!("fio JSON: no number '{key}'"))
}

/// Parse fio's JSON output (text before the first `{` is skipped).
pub fn parse_fio_json(text: &str) -> Result<Vec<FioJob>> {
    let start = text
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no JSON: {}", text.trim()))?;
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    let root = stream
        .next()
        .ok_or_else(|| anyhow!("fio printed no JSON"))?
        .context("fio's JSON does not parse")?;
    let jobs = root
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("fio JSON: no 'jobs' array"))?;
    if jobs.is_empty() {
        bail!("fio JSON: 'jobs' is empty");
    }
    jobs.iter()
        .map(|j| {
            let read = j
                .get("read")
                .ok_or_else(|| anyhow!("fio JSON: job without 'read'"))?;
            let write = j
                .get("write")
                .ok_or_else(|| anyhow!("fio JSON: job without 'write'"))?;
            Ok(FioJob {
                name: j
                    .get("jobname")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                error: j.get("error").and_then(Value::as_i64).unwrap_or(-1),
                read_bw_bytes: num(read, "bw_bytes")?,
                write_bw_bytes: num(write, "bw_bytes")?,
                read_io_bytes: num(read, "io_bytes")? as u64,
                write_io_bytes: num(write, "io_bytes")? as u64,
                read_iops: num(read, "iops")?,
                write_iops: num(write, "iops")?,
            })
        })
        .collect()
}

/// fio's arguments for one client running `op` on `uri` for `runtime_secs`.
pub fn job_args(
    name: &str,
    uri: &str,
    op: Op,
    size: u64,
    runtime_secs: u64,
    iodepth: u32,
) -> Vec<String> {
    let mut a = common(name, uri, op.fio_rw(), op.block_size(), size, iodepth);
    a.push("--time_based=1".into());
    a.push(format!("--runtime={runtime_secs}"));
    a
}

/// fio's arguments to write the whole disk once, sequentially (so reads read data).
pub fn prefill_args(name: &str, uri: &str, size: u64, iodepth: u32) -> Vec<String> {
    common(name, uri, "write", "1M", size, iodepth)
}

fn common(name: &str, uri: &str, rw: &str, bs: &str, size: u64, iodepth: u32) -> Vec<String> {
    vec![
        format!("--name={name}"),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        format!("--rw={rw}"),
        format!("--bs={bs}"),
        format!("--iodepth={iodepth}"),
        format!("--size={size}"),
        "--output-format=json".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_job_args_for_small_read() {
        let a = job_args("c3", "nbd://127.0.0.1:9/c3", Op::SmallRead, 1 << 20, 2, 4);
        assert!(a.contains(&"--rw=randread".to_string()));
        assert!(a.contains(&"--bs=4k".to_string()));
        assert!(a.contains(&"--iodepth=4".to_string()));
        assert!(a.contains(&"--size=1048576".to_string()));
        assert!(a.contains(&"--runtime=2".to_string()));
        assert!(a.contains(&"--ioengine=nbd".to_string()));
        let p = prefill_args("c3", "nbd://x/c3", 1 << 20, 4);
        assert!(p.contains(&"--rw=write".to_string()));
        assert!(!p.iter().any(|s| s.starts_with("--time_based")));
    }

    #[test]
    fn test_parse_rejects_garbage() {
        assert!(parse_fio_json("fio: connection refused\n").is_err());
        assert!(parse_fio_json("{\"jobs\": []}").is_err());
        assert!(parse_fio_json("{\"jobs\": [{\"jobname\": \"a\"}]}").is_err());
        assert!(parse_fio_json("{ truncated").is_err());
    }
}
