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
//!
//! The node's NBD endpoint is its unix socket on its own host, else its TCP port, with
//! TLS and the CLI's client certificate when `DROVE_CA` holds one
//! ([`crate::nbd_target`]): both commands work from any host that reaches a node.
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use drove_daemon::api::{CreateVdi, VdiDetail};
use drove_types::{format_size, validate_name, NodeId, ReplicationMode, VdiInfo};
use serde::Serialize;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::client::{print_json, Ctx};
use crate::nbd_target::{explain, libnbd_uri, qemu_spec, target_of, Target};
use crate::qemu_img::{convert, data_bytes, image_info, qemu_path, MIB};

/// Image formats drove names on the command line (qemu-img's names).
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// Plain bytes, sparse where the disk is zero.
    Raw,
    /// QEMU copy-on-write v2 (only written clusters take space).
    Qcow2,
}

impl Format {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
        }
    }
}

/// `drove vdi import FILE NAME`.
#[derive(Args)]
pub struct ImportArgs {
    /// Image file to copy from (raw, qcow2, or any format `qemu-img info` detects),
    /// or `-` for raw bytes from stdin (then --size is needed).
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
    /// Size of the VDI made from stdin (`-`), e.g. 10G: a pipe does not say how
    /// long it is. Fewer bytes leave the rest zero; more fail the import.
    #[arg(long)]
    pub size: Option<String>,
    /// Id of the node whose NBD endpoint receives the data (its unix socket when that
    /// exists on this host, else its TCP address, with TLS when DROVE_CA holds a
    /// client certificate) [default: the --cluster node].
    #[arg(long)]
    pub node: Option<u64>,
}

/// `drove vdi export NAME FILE`.
#[derive(Args)]
pub struct ExportArgs {
    /// VDI to copy from. There is no snapshot: exported while a VM writes it, the
    /// file mixes blocks from different moments, so stop or pause the VM first.
    pub name: String,
    /// File to write (sparse where the VDI reads as zeros), or `-` for raw bytes on
    /// stdout (then the summary goes to stderr).
    pub file: PathBuf,
    /// Format of FILE.
    #[arg(long, value_enum, default_value = "raw")]
    pub format: Format,
    /// Replace FILE if it exists (it is replaced only once the copy is complete).
    #[arg(long)]
    pub force: bool,
    /// Id of the node whose NBD endpoint serves the data (its unix socket when that
    /// exists on this host, else its TCP address, with TLS when DROVE_CA holds a
    /// client certificate) [default: the --cluster node].
    #[arg(long)]
    pub node: Option<u64>,
}

/// What `--json` prints, and what the one-line summary says.
#[derive(Serialize)]
pub(crate) struct Summary {
    op: &'static str,
    vdi: String,
    file: String,
    format: String,
    node: u64,
    /// How the data reached the node: `unix` (its socket), `tcp`, or `tls` (TCP
    /// with the CLI's client certificate).
    via: &'static str,
    /// Virtual size copied.
    bytes: u64,
    /// Bytes the source reports as data (`qemu-img map`); zeros are skipped.
    data_bytes: Option<u64>,
    seconds: f64,
    mib_per_s: f64,
}

impl Summary {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        op: &'static str,
        vdi: &str,
        file: String,
        format: &str,
        ep: &Endpoint,
        bytes: u64,
        data_bytes: Option<u64>,
        seconds: f64,
    ) -> Self {
        let (vdi, format, node) = (vdi.to_string(), format.to_string(), ep.node.0);
        let mib_per_s = bytes as f64 / MIB / seconds.max(1e-6);
        Summary {
            op,
            vdi,
            file,
            format,
            node,
            via: ep.target.via(),
            bytes,
            data_bytes,
            seconds,
            mib_per_s,
        }
    }

    /// On stdout, or on stderr when stdout carries the image (`-`).
    pub(crate) fn print(&self, ctx: &Ctx) -> Result<()> {
        let to_stderr = self.op == "export" && self.file == "-";
        if ctx.json {
            if to_stderr {
                eprintln!("{}", serde_json::to_string(self)?);
                return Ok(());
            }
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
        let via = match self.via {
            "unix" => "its unix socket",
            "tls" => "TCP with TLS",
            _ => "TCP",
        };
        let line = format!(
            "{done} {from} to {to} ({}) through node {} ({via}): {} ({} bytes{data}) in {:.2} s, {:.1} MiB/s",
            self.format,
            self.node,
            format_size(self.bytes),
            self.bytes,
            self.seconds,
            self.mib_per_s
        );
        if to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
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
    let _: ReplicationMode = a.mode.parse()?;
    if a.file.as_os_str() == "-" {
        return crate::stream::import(a, ctx).await;
    }
    if a.size.is_some() {
        bail!("--size is for an import from stdin (`-`); a file's image says its size");
    }
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
    let src = qemu_path(&a.file);
    let shown = fmt.clone();
    let label = format!("import {}", a.name);
    let json = ctx.json;
    let (ep, (data, secs)) = with_new_vdi(ctx, &a, vsize, &file_s, |ep| async move {
        let data = data_bytes(&[], &src, &fmt).await;
        // `-t writeback` (not `unsafe`): qemu-img sends a FLUSH at the end, which
        // drove makes durable on every replica, so import returns once data is safe.
        let mut args = os(&["convert", "-n", "-p", "-t", "writeback", "-f", &fmt]);
        args.extend(os(&["-O", "raw", "--target-is-zero"]));
        args.extend(ep.qemu_objects.iter().cloned());
        args.extend([src.clone(), OsString::from(&ep.qemu_file)]);
        let secs = convert(&args, vsize, &label, json).await?;
        Ok((data, secs))
    })
    .await?;
    Summary::new("import", &a.name, file_s, &shown, &ep, vsize, data, secs).print(ctx)
}

/// Create VDI `a.name` of `size` bytes (rounded up to 512), run `copy` against a
/// node's NBD endpoint for it, and delete the VDI again if anything fails.
pub(crate) async fn with_new_vdi<T, F, Fut>(
    ctx: &Ctx,
    a: &ImportArgs,
    size: u64,
    file_s: &str,
    copy: F,
) -> Result<(Endpoint, T)>
where
    F: FnOnce(Endpoint) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mode: ReplicationMode = a.mode.parse()?;
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    if vdis.iter().any(|v| v.name == a.name) {
        bail!(
            "VDI '{}' already exists; import never overwrites: choose another NAME or run `drove vdi delete {}` first",
            a.name,
            a.name
        );
    }
    let ep = endpoint(ctx, a.node, &a.name).await?;
    let size = size.div_ceil(512) * 512;
    let _: VdiDetail = ctx
        .post(
            "/api/vdis",
            &CreateVdi {
                name: a.name.clone(),
                size,
                copies: a.copies,
                mode,
                min_copies: a.min_copies,
                home_zone: None,
                home_copies: None,
                write: Default::default(),
                qos: Default::default(),
            },
        )
        .await?;
    // From here on the VDI is ours: any failure deletes it again.
    let res = async {
        wait_visible(ctx, &ep.admin, &a.name).await?;
        let (target, node) = (ep.target.clone(), ep.node);
        copy(ep.clone())
            .await
            .map_err(|e| explain(&target, node, e))
    }
    .await;
    match res {
        Ok(r) => Ok((ep, r)),
        Err(e) => match delete_vdi(ctx, &a.name).await {
            Ok(()) => bail!("Import of '{file_s}' failed, VDI '{}' deleted again: {e:#}", a.name),
            Err(d) => bail!(
                "Import of '{file_s}' failed: {e:#}; deleting the half-written VDI '{}' failed too ({d:#}): run `drove vdi delete {}`",
                a.name,
                a.name
            ),
        },
    }
}

pub async fn export(a: ExportArgs, ctx: &Ctx) -> Result<()> {
    validate_name(&a.name)?;
    if a.file.as_os_str() == "-" {
        return crate::stream::export(a, ctx).await;
    }
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
    let src = OsString::from(&ep.qemu_file);
    let data = data_bytes(&ep.qemu_objects, &src, "raw").await;
    let mut args = os(&["convert", "-p", "-f", "raw", "-O", a.format.name()]);
    args.extend(ep.qemu_objects.iter().cloned());
    args.extend([src, qemu_path(&tmp)]);
    let res = async {
        let secs = convert(&args, d.info.size, &format!("export {}", a.name), ctx.json)
            .await
            .map_err(|e| explain(&ep.target, ep.node, e))?;
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
    Summary::new("export", &a.name, file_s, fmt, &ep, size, data, secs).print(ctx)
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

/// Where qemu-img and nbdcopy reach a node's NBD server, and the node's admin
/// address.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) node: NodeId,
    pub(crate) admin: String,
    pub(crate) target: Target,
    /// qemu-img's `--object` arguments (the TLS credentials; none without TLS).
    pub(crate) qemu_objects: Vec<OsString>,
    /// qemu-img's filename of the VDI.
    pub(crate) qemu_file: String,
    /// nbdcopy's URI of the VDI.
    pub(crate) libnbd_uri: String,
}

pub(crate) async fn endpoint(ctx: &Ctx, node: Option<u64>, vdi: &str) -> Result<Endpoint> {
    let n = target_of(ctx, node).await?;
    let (qemu_objects, qemu_file) = qemu_spec(&n.target, vdi)?;
    Ok(Endpoint {
        node: n.id,
        admin: n.admin,
        libnbd_uri: libnbd_uri(&n.target, vdi),
        target: n.target,
        qemu_objects,
        qemu_file,
    })
}

/// The metadata reaches each node through Raft: a node may not serve a VDI created a
/// moment ago through another one yet.
pub(crate) async fn wait_visible(ctx: &Ctx, admin: &str, vdi: &str) -> Result<()> {
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
pub(crate) async fn delete_vdi(ctx: &Ctx, vdi: &str) -> Result<()> {
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
