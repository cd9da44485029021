//! Running `qemu-img` for `drove vdi import` and `export`: paths it will not read as
//! protocols, its errors as sentences, the image's size and data, and `convert` with a
//! progress line (rate, ETA) drawn from its `-p` output; what it says on stderr after
//! a copy that succeeded is shown, and a corrupt image fails the copy.
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::transfer::Format;

pub(crate) const MIB: f64 = 1048576.0;

/// qemu-img reads a leading `proto:` as a protocol; `./` keeps relative paths files.
pub(crate) fn qemu_path(p: &Path) -> OsString {
    if p.is_absolute() {
        p.as_os_str().to_owned()
    } else {
        Path::new(".").join(p).into_os_string()
    }
}

pub(crate) fn qemu_img() -> Command {
    let mut c = Command::new("qemu-img");
    c.stdin(std::process::Stdio::null()).kill_on_drop(true);
    c
}

pub(crate) fn spawn_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        anyhow!("qemu-img is not installed (Debian: apt-get install qemu-utils)")
    } else {
        anyhow!("Cannot run qemu-img: {e}")
    }
}

/// What qemu-img said on stderr (its last 3 lines, which hold the cause), on one
/// line and without the `qemu-img: ` prefixes.
pub(crate) fn qemu_error(stderr: &[u8]) -> String {
    let t = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = t
        .lines()
        .map(|l| l.trim().trim_start_matches("qemu-img: "))
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return "no message".to_string();
    }
    lines[lines.len().saturating_sub(3)..].join("; ")
}

/// Virtual size and format of an image file.
pub(crate) async fn image_info(file: &Path, format: Option<Format>) -> Result<(u64, String)> {
    let mut c = qemu_img();
    c.args(["info", "--output=json"]);
    if let Some(f) = format {
        c.args(["-f", f.name()]);
    }
    let o = c.arg(qemu_path(file)).output().await.map_err(spawn_error)?;
    if !o.status.success() {
        bail!(
            "Cannot read '{}': {}",
            file.display(),
            qemu_error(&o.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .map_err(|e| anyhow!("Unexpected `qemu-img info` output: {e}"))?;
    let size = v["virtual-size"].as_u64().ok_or_else(|| {
        anyhow!(
            "`qemu-img info` gave no virtual size for '{}'",
            file.display()
        )
    })?;
    let fmt = v["format"].as_str().unwrap_or("raw").to_string();
    Ok((size, fmt))
}

/// Bytes `qemu-img map` reports as data in `src` (opened with `objects`, e.g. TLS
/// credentials); `None` when it cannot tell.
pub(crate) async fn data_bytes(objects: &[OsString], src: &OsString, fmt: &str) -> Option<u64> {
    let o = qemu_img()
        .args(["map", "--output=json", "-f", fmt])
        .args(objects)
        .arg(src)
        .output()
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    let sum = v
        .as_array()?
        .iter()
        .filter(|e| e["data"].as_bool() == Some(true))
        .filter_map(|e| e["length"].as_u64())
        .sum();
    o.status.success().then_some(sum)
}

/// Run `qemu-img ARGS` (a `convert -p`) and return its seconds. Ctrl-C stops it
/// (the child dies with us: `kill_on_drop`) so the caller can clean up.
pub(crate) async fn convert(args: &[OsString], size: u64, label: &str, json: bool) -> Result<f64> {
    let start = Instant::now();
    let mut child = qemu_img()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        bail!("qemu-img started without its output pipes");
    };
    let errs = tokio::spawn(async move {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b).await;
        b
    });
    let mut bar = Progress::new(size, label, !json && std::io::stderr().is_terminal());
    let run = async {
        let mut buf = [0u8; 512];
        let mut seg = Vec::new();
        loop {
            let n = out
                .read(&mut buf)
                .await
                .context("Reading qemu-img progress")?;
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                if b == b'\r' || b == b'\n' {
                    if let Some(p) = parse_percent(&String::from_utf8_lossy(&seg)) {
                        bar.update(p);
                    }
                    seg.clear();
                } else {
                    seg.push(b);
                }
            }
        }
        child.wait().await.context("Waiting for qemu-img")
    };
    let status = tokio::select! {
        s = run => s,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    bar.finish();
    let status = status?;
    let stderr = errs.await.unwrap_or_default();
    if !status.success() {
        bail!("qemu-img: {}", qemu_error(&stderr));
    }
    judge_warnings(&stderr)?;
    Ok(start.elapsed().as_secs_f64())
}

/// What a `convert` that succeeded said on stderr: a corrupt image refuses the
/// copy (qemu-img converts a qcow2 whose refcount table is broken, says "Image is
/// corrupt" and exits 0; its data may be wrong), anything else is passed on as a
/// warning. Neither is hidden.
fn judge_warnings(stderr: &[u8]) -> Result<()> {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.iter().any(|l| l.contains("corrupt")) {
        bail!(
            "qemu-img: {} (it copied the image all the same, but what it read may be \
             wrong): check the image with `qemu-img check`, repair a copy of it with \
             `qemu-img check -r all`, and import that",
            qemu_error(stderr)
        );
    }
    for l in lines {
        let _ = writeln!(
            std::io::stderr(),
            "warning: qemu-img: {}",
            l.trim_start_matches("qemu-img: ")
        );
    }
    Ok(())
}

/// qemu-img's `-p` lines look like `    (12.34/100%)`.
fn parse_percent(seg: &str) -> Option<f64> {
    let p: f64 = seg
        .trim()
        .strip_prefix('(')?
        .strip_suffix("/100%)")?
        .parse()
        .ok()?;
    (0.0..=100.0).contains(&p).then_some(p)
}

/// One redrawn line on stderr (indicatif): percent, bytes per second, ETA. Silent
/// when stderr is not a terminal or `on` is false.
pub(crate) struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    pub(crate) fn new(size: u64, label: &str, on: bool) -> Self {
        let bar = if on {
            indicatif::ProgressBar::new(size)
        } else {
            indicatif::ProgressBar::hidden()
        };
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg}: {percent:>3}%  {binary_bytes_per_sec:>12}  ETA {eta}",
        ) {
            bar.set_style(style);
        }
        bar.set_message(label.to_string());
        Progress { bar }
    }

    /// `pct` percent of the size is done.
    pub(crate) fn update(&mut self, pct: f64) {
        let size = self.bar.length().unwrap_or(0);
        self.bar
            .set_position((size as f64 * pct.clamp(0.0, 100.0) / 100.0) as u64);
    }

    /// Erase the line.
    pub(crate) fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_percent_reads_qemu_img_progress_lines() {
        assert_eq!(parse_percent("    (12.34/100%)"), Some(12.34));
        assert_eq!(parse_percent("(100.00/100%)"), Some(100.0));
        assert_eq!(parse_percent("(101.00/100%)"), None);
        assert_eq!(parse_percent("qemu-img: error"), None);
        assert_eq!(parse_percent(""), None);
    }

    #[test]
    fn test_a_corrupt_image_is_refused_and_other_warnings_pass() {
        let corrupt = b"qcow2: Image is corrupt: Refblock offset 0x12200 unaligned \
            (reftable index: 0); further non-fatal corruption events will be suppressed\n";
        let e = judge_warnings(corrupt).unwrap_err().to_string();
        assert!(e.contains("Image is corrupt: Refblock offset"), "{e}");
        assert!(e.contains("qemu-img check -r all"), "{e}");
        assert!(judge_warnings(b"").is_ok());
        assert!(judge_warnings(b"qemu-img: some note\n").is_ok());
    }

    #[test]
    fn test_qemu_path_protects_relative_names_with_colons() {
        assert_eq!(qemu_path(Path::new("nbd:x")), OsString::from("./nbd:x"));
        assert_eq!(qemu_path(Path::new("/t/a:b")), OsString::from("/t/a:b"));
    }
}
