//! `drove vdi import` and `drove vdi export`: move a whole disk image between a file
//! (raw, qcow2, ...) and a VDI. drove does not parse image formats itself: it runs
//! `qemu-img convert` against one node's NBD endpoint, the same door QEMU uses, so the
//! data takes the normal write path (gateway, replicas, object store).
//!
//! Import creates the VDI first and copies with `-n --target-is-zero`: a new VDI reads
//! as zeros, so zero ranges of the image are neither sent nor stored (objects are
//! sparse files). If anything fails after the VDI was created, it is deleted again.
//! Export writes a temporary file next to FILE and renames it into place at the end, so
//! a failed export leaves neither half a file nor a damaged old one.
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use drove_daemon::api::{CreateVdi, Status, VdiDetail};
use drove_types::{format_size, validate_name, NodeId, NodeState, ReplicationMode, VdiInfo};
use serde::Serialize;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::client::{print_json, Ctx};

const MIB: f64 = 1048576.0;

/// Image formats drove names on the command line (qemu-img's names).
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// Plain bytes, sparse where the disk is zero.
    Raw,
    /// QEMU copy-on-write v2 (only written clusters take space).
    Qcow2,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
        }
    }
}

/// `drove vdi import FILE NAME`.
#[derive(Args)]
pub struct ImportArgs {
    /// Image file to copy from (raw, qcow2, or any format `qemu-img info` detects).
    pub file: PathBuf,
    /// Name of the VDI to create (also its NBD export name); an existing VDI is
    /// never overwritten.
    pub name: String,
    /// Copies of every object (1..=5); the cluster default when omitted.
    #[arg(long)]
    pub copies: Option<u8>,
    /// How writes reach the replicas: `direct` or `primary-copy`.
    #[arg(long, default_value = "direct")]
    pub mode: String,
    /// Replicas that must have a write while others are down (default: copies - 1,
    /// at least 1), as for `drove vdi create`.
    #[arg(long)]
    pub min_copies: Option<u8>,
    /// Format of FILE; detected with `qemu-img info` when omitted. Pass `--format raw`
    /// for raw images from untrusted sources: detection lets a raw image whose first
    /// bytes look like a qcow2 header be read as qcow2.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Id of the node whose NBD endpoint receives the data (its unix socket when that
    /// exists on this host, else its TCP address) [default: the --cluster node].
    #[arg(long)]
    pub node: Option<u64>,
}

/// `drove vdi export NAME FILE`.
#[derive(Args)]
pub struct ExportArgs {
    /// VDI to copy from. There is no snapshot: exported while a VM writes it, the
    /// file mixes blocks from different moments, so stop or pause the VM first.
    pub name: String,
    /// File to write (sparse where the VDI reads as zeros).
    pub file: PathBuf,
    /// Format of FILE.
    #[arg(long, value_enum, default_value = "raw")]
    pub format: Format,
    /// Replace FILE if it exists (it is replaced only once the copy is complete).
    #[arg(long)]
    pub force: bool,
    /// Id of the node whose NBD endpoint serves the data (its unix socket when that
    /// exists on this host, else its TCP address) [default: the --cluster node].
    #[arg(long)]
    pub node: Option<u64>,
}

/// What `--json` prints, and what the one-line summary says.
#[derive(Serialize)]
struct Summary {
    op: &'static str,
    vdi: String,
    file: String,
    format: String,
    node: u64,
    /// Virtual size copied.
    bytes: u64,
    /// Bytes the source reports as data (`qemu-img map`); zeros are skipped.
    data_bytes: Option<u64>,
    seconds: f64,
    mib_per_s: f64,
}

impl Summary {
    #[allow(clippy::too_many_arguments)]
    fn new(
        op: &'static str,
        vdi: &str,
        file: String,
        format: &str,
        node: NodeId,
        bytes: u64,
        data_bytes: Option<u64>,
        seconds: f64,
    ) -> Self {
        let (vdi, format, node) = (vdi.to_string(), format.to_string(), node.0);
        let mib_per_s = bytes as f64 / MIB / seconds.max(1e-6);
        Summary {
            op,
            vdi,
            file,
            format,
            node,
            bytes,
            data_bytes,
            seconds,
            mib_per_s,
        }
    }

    fn print(&self, ctx: &Ctx) -> Result<()> {
        if ctx.json {
            return print_json(self);
        }
        let (done, from, to) = match self.op {
            "import" => (
                "Imported",
                format!("'{}'", self.file),
                format!("VDI '{}'", self.vdi),
            ),
            _ => (
                "Exported",
                format!("VDI '{}'", self.vdi),
                format!("'{}'", self.file),
            ),
        };
        let data = self
            .data_bytes
            .map(|d| format!(", {} of data", format_size(d)))
            .unwrap_or_default();
        println!(
            "{done} {from} to {to} ({}) through node {}: {} ({} bytes{data}) in {:.2} s, {:.1} MiB/s",
            self.format,
            self.node,
            format_size(self.bytes),
            self.bytes,
            self.seconds,
            self.mib_per_s
        );
        Ok(())
    }
}

pub async fn import(a: ImportArgs, ctx: &Ctx) -> Result<()> {
    validate_name(&a.name)?;
    if let Some(c) = a.copies {
        if c == 0 || c > drove_types::MAX_COPIES {
            bail!("Bad --copies {c}: use 1 to {}", drove_types::MAX_COPIES);
        }
    }
    let mode: ReplicationMode = a.mode.parse()?;
    let file_s = a.file.display().to_string();
    match std::fs::metadata(&a.file).and_then(|m| {
        if m.is_dir() {
            return Err(std::io::Error::other("it is a directory"));
        }
        std::fs::File::open(&a.file).map(drop)
    }) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("Cannot import '{file_s}': no such file")
        }
        Err(e) => bail!("Cannot import '{file_s}': {e}"),
    }
    let (vsize, fmt) = image_info(&a.file, a.format).await?;
    if vsize == 0 {
        bail!("Cannot import '{file_s}': its virtual size is 0 bytes");
    }
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    if vdis.iter().any(|v| v.name == a.name) {
        bail!(
            "VDI '{}' already exists; import never overwrites: choose another NAME or run `drove vdi delete {}` first",
            a.name,
            a.name
        );
    }
    let ep = endpoint(ctx, a.node, &a.name).await?;
    let size = vsize.div_ceil(512) * 512;
    let _: VdiDetail = ctx
        .post(
            "/api/vdis",
            &CreateVdi {
                name: a.name.clone(),
                size,
                copies: a.copies,
                mode,
                min_copies: a.min_copies,
            },
        )
        .await?;
    // From here on the VDI is ours: any failure deletes it again.
    let src = qemu_path(&a.file);
    let res = async {
        wait_visible(ctx, &ep.admin, &a.name).await?;
        let data = data_bytes(&src, &fmt).await;
        // `-t writeback` (not `unsafe`): qemu-img sends a FLUSH at the end, which
        // drove makes durable on every replica, so import returns once data is safe.
        let mut args = os(&["convert", "-n", "-p", "-t", "writeback", "-f", &fmt]);
        args.extend(os(&["-O", "raw", "--target-is-zero"]));
        args.extend([src.clone(), OsString::from(&ep.uri)]);
        let secs = convert(&args, vsize, &format!("import {}", a.name), ctx.json).await?;
        Ok::<_, anyhow::Error>((data, secs))
    }
    .await;
    let (data, secs) = match res {
        Ok(r) => r,
        Err(e) => match delete_vdi(ctx, &a.name).await {
            Ok(()) => bail!("Import of '{file_s}' failed, VDI '{}' deleted again: {e:#}", a.name),
            Err(d) => bail!(
                "Import of '{file_s}' failed: {e:#}; deleting the half-written VDI '{}' failed too ({d:#}): run `drove vdi delete {}`",
                a.name,
                a.name
            ),
        },
    };
    Summary::new("import", &a.name, file_s, &fmt, ep.node, vsize, data, secs).print(ctx)
}

pub async fn export(a: ExportArgs, ctx: &Ctx) -> Result<()> {
    validate_name(&a.name)?;
    let file_s = a.file.display().to_string();
    match std::fs::symlink_metadata(&a.file) {
        Ok(m) if !a.force => bail!(
            "'{file_s}' already exists ({}); pass --force to replace it",
            if m.is_dir() { "a directory" } else { "a file" }
        ),
        Ok(m) if !m.is_file() => {
            bail!("'{file_s}' exists and is not a regular file; not replacing it")
        }
        _ => {}
    }
    let name = a
        .file
        .file_name()
        .ok_or_else(|| anyhow!("'{file_s}' does not name a file"))?;
    let dir = match a.file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!(
            "Cannot export to '{file_s}': directory '{}' does not exist",
            dir.display()
        );
    }
    let d: VdiDetail = ctx.get(&format!("/api/vdis/{}", a.name)).await?;
    let ep = endpoint(ctx, a.node, &a.name).await?;
    wait_visible(ctx, &ep.admin, &a.name).await?;
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".drove-export.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let src = OsString::from(&ep.uri);
    let data = data_bytes(&src, "raw").await;
    let mut args = os(&["convert", "-p", "-f", "raw", "-O", a.format.name()]);
    args.extend([src, qemu_path(&tmp)]);
    let res = async {
        let secs = convert(&args, d.info.size, &format!("export {}", a.name), ctx.json).await?;
        place(&tmp, &a.file, a.force)?;
        Ok::<_, anyhow::Error>(secs)
    }
    .await;
    let secs = match res {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.context(format!("Export of VDI '{}' failed", a.name)));
        }
    };
    let (fmt, size) = (a.format.name(), d.info.size);
    Summary::new("export", &a.name, file_s, fmt, ep.node, size, data, secs).print(ctx)
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Move the finished temporary file to `file`. Without `force` a hard link makes the
/// "does not exist yet" check and the placing one atomic step.
fn place(tmp: &Path, file: &Path, force: bool) -> Result<()> {
    let shown = file.display();
    if force {
        return std::fs::rename(tmp, file).with_context(|| format!("Cannot write '{shown}'"));
    }
    match std::fs::hard_link(tmp, file) {
        Ok(()) => {
            std::fs::remove_file(tmp).with_context(|| format!("Cannot remove {}", tmp.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!("'{shown}' appeared while exporting; pass --force to replace it")
        }
        // Filesystems without hard links: the check is no longer atomic, but still made.
        Err(_) if !file.exists() => {
            std::fs::rename(tmp, file).with_context(|| format!("Cannot write '{shown}'"))
        }
        Err(e) => bail!("Cannot write '{shown}': {e}"),
    }
}

/// Where qemu-img reaches a node's NBD server, and the node's admin address.
struct Endpoint {
    node: NodeId,
    admin: String,
    uri: String,
}

async fn endpoint(ctx: &Ctx, node: Option<u64>, vdi: &str) -> Result<Endpoint> {
    let s: Status = ctx.get("/api/status").await?;
    let id = node.map(NodeId).unwrap_or(s.node_id);
    let Some(n) = s.map.node(id) else {
        let ids: Vec<String> = s.map.nodes.keys().map(|k| k.to_string()).collect();
        bail!("No node {id} in the cluster (nodes: {})", ids.join(", "));
    };
    if n.state == NodeState::Down {
        bail!("Node {id} is down; pick another with --node");
    }
    // The unix socket only works on the node's own host; its path existing here is
    // how we tell.
    let uri = if Path::new(&n.nbd_socket).exists() {
        format!("nbd+unix:///{vdi}?socket={}", escape(&n.nbd_socket))
    } else {
        format!("nbd://{}/{vdi}", n.nbd_addr)
    };
    Ok(Endpoint {
        node: id,
        admin: n.admin_addr.clone(),
        uri,
    })
}

/// Percent-encode a socket path for the URI's query (qemu decodes it).
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"/._~-".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The metadata reaches each node through Raft: a node may not serve a VDI created a
/// moment ago through another one yet.
async fn wait_visible(ctx: &Ctx, admin: &str, vdi: &str) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match ctx
            .get_at::<serde_json::Value>(admin, &format!("/api/vdis/{vdi}"))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > end => {
                return Err(e.context(format!("VDI '{vdi}' did not show up on node {admin}")))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Delete a VDI import created; retried because the lock of the qemu-img connection
/// that just ended may take a moment to go.
async fn delete_vdi(ctx: &Ctx, vdi: &str) -> Result<()> {
    let mut last = anyhow!("not tried");
    for _ in 0..5 {
        match ctx
            .delete::<serde_json::Value>(&format!("/api/vdis/{vdi}"))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

/// qemu-img reads a leading `proto:` as a protocol; `./` keeps relative paths files.
fn qemu_path(p: &Path) -> OsString {
    if p.is_absolute() {
        p.as_os_str().to_owned()
    } else {
        Path::new(".").join(p).into_os_string()
    }
}

fn qemu_img() -> Command {
    let mut c = Command::new("qemu-img");
    c.stdin(std::process::Stdio::null()).kill_on_drop(true);
    c
}

fn spawn_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        anyhow!("qemu-img is not installed (Debian: apt-get install qemu-utils)")
    } else {
        anyhow!("Cannot run qemu-img: {e}")
    }
}

/// What qemu-img said on stderr (its last 3 lines, which hold the cause), on one
/// line and without the `qemu-img: ` prefixes.
fn qemu_error(stderr: &[u8]) -> String {
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
async fn image_info(file: &Path, format: Option<Format>) -> Result<(u64, String)> {
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

/// Bytes `qemu-img map` reports as data in `src`; `None` when it cannot tell.
async fn data_bytes(src: &OsString, fmt: &str) -> Option<u64> {
    let o = qemu_img()
        .args(["map", "--output=json", "-f", fmt])
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
async fn convert(args: &[OsString], size: u64, label: &str, json: bool) -> Result<f64> {
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
    Ok(start.elapsed().as_secs_f64())
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

/// One redrawn line on stderr: percent, MiB/s, ETA. Silent when not on a terminal.
struct Progress {
    start: Instant,
    size: u64,
    label: String,
    on: bool,
    drawn: Option<Instant>,
}

impl Progress {
    fn new(size: u64, label: &str, on: bool) -> Self {
        Progress {
            start: Instant::now(),
            size,
            label: label.to_string(),
            on,
            drawn: None,
        }
    }

    fn update(&mut self, pct: f64) {
        let now = Instant::now();
        if !self.on
            || self
                .drawn
                .is_some_and(|t| now - t < Duration::from_millis(100))
        {
            return;
        }
        self.drawn = Some(now);
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let rate = self.size as f64 * pct / 100.0 / MIB / secs;
        let eta = if pct > 0.0 {
            let left = (secs * (100.0 - pct) / pct) as u64;
            format!("{}:{:02}", left / 60, left % 60)
        } else {
            "--:--".to_string()
        };
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r{}: {pct:5.1}%  {rate:8.1} MiB/s  ETA {eta}\x1b[K",
            self.label
        );
        let _ = e.flush();
    }

    fn finish(&mut self) {
        if self.on && self.drawn.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
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
    fn test_escape_keeps_paths_and_encodes_uri_specials() {
        assert_eq!(escape("/a/b-c_d.sock"), "/a/b-c_d.sock");
        assert_eq!(escape("/a b/x&y?"), "/a%20b/x%26y%3F");
    }

    #[test]
    fn test_qemu_path_protects_relative_names_with_colons() {
        assert_eq!(qemu_path(Path::new("nbd:x")), OsString::from("./nbd:x"));
        assert_eq!(qemu_path(Path::new("/t/a:b")), OsString::from("/t/a:b"));
    }
}
