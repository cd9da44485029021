//! `drove vdi export-diff` and `drove vdi import-diff`: incremental backups between
//! two snapshots (`rbd export-diff`, Sheepdog's `dog vdi backup`).
//!
//! What may differ between snapshots FROM and TO is known from the metadata alone:
//! with Sheepdog's scheme (docs/snapshots-clones.md) the id a snapshot keeps owns
//! exactly the objects written after the snapshot before it. So only the objects of
//! TO's id and its parents' up to FROM can differ; every node lists which of them it
//! stores (`GET /api/local/objects`). Those objects are read from both snapshots
//! through a node's NBD server and compared in 64 KiB blocks, and only the blocks
//! that differ go into the diff (format in [`crate::diff_format`]). A disk that
//! changed 1 GiB between two snapshots thus gives a diff of about 1 GiB, whatever its
//! size; reading costs the changed objects, from both snapshots.
//!
//! An incremental diff records its base: for every object it changes, the SHA-256 of
//! what FROM held there. import-diff ([`crate::diff_import`]) checks the VDI it writes
//! against that, and the whole file against its checksums, before writing anything.
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use drove_daemon::api::{LocalObjects, Status};
use drove_types::{format_size, NodeState, VdiId, VdiInfo};
use serde::Serialize;
use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use crate::client::{print_json, Ctx};
use crate::diff_format::{sha256, DiffWriter, Header, Snap, Totals};
use crate::diff_plan::{changed_runs, plan, Plan, Run};
use crate::nbd_client::NbdClient;
use crate::nbd_target::target_of;
use crate::qemu_img::Progress;

pub use crate::diff_import::import_diff;

/// `drove vdi export-diff NAME --from SNAP1 --to SNAP2 FILE`.
#[derive(Args)]
pub struct ExportDiffArgs {
    /// The VDI whose snapshots are compared (--to is NAME's snapshot or one of its
    /// parents'; see `drove vdi tree`).
    pub name: String,
    /// File to write (only once the diff is complete), or `-` for stdout.
    pub file: PathBuf,
    /// The older snapshot. Without it the diff holds everything --to holds: a full
    /// backup, which import-diff applies to a new VDI.
    #[arg(long)]
    pub from: Option<String>,
    /// The newer snapshot.
    #[arg(long)]
    pub to: String,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// Id of the node whose NBD server is read (its unix socket when it exists on
    /// this host, else its TCP port, with TLS when DROVE_CA holds a client
    /// certificate) [default: the --cluster node].
    #[arg(long)]
    pub node: Option<u64>,
}

/// `drove vdi import-diff FILE NAME`.
#[derive(Args)]
pub struct ImportDiffArgs {
    /// A diff export-diff wrote, or `-` for stdin (kept in a temporary file first:
    /// the whole diff is checked before anything is written).
    pub file: PathBuf,
    /// The VDI to apply it to. A full diff (made without --from) creates it: it
    /// must not exist. An incremental diff applies only to a VDI unchanged since a
    /// snapshot that holds what the diff's --from held (see --base); it is checked
    /// before anything is written.
    pub name: String,
    /// The snapshot of NAME that holds what the diff's --from snapshot held: NAME
    /// must have been taken from it and not written since [default: the snapshot
    /// named as the diff's --from]. Where the diff changes the disk, NAME must hold
    /// exactly the bytes --from held (the diff carries their checksums).
    #[arg(long)]
    pub base: Option<String>,
    /// Then take a snapshot of NAME with this name: the --base of the next
    /// incremental diff.
    #[arg(long)]
    pub snapshot: Option<String>,
    /// Copies of the VDI a full diff creates (1..=5; the cluster default when
    /// omitted).
    #[arg(long)]
    pub copies: Option<u8>,
    /// Id of the node whose NBD server is written (its unix socket when it exists
    /// on this host, else its TCP port, with TLS when DROVE_CA holds a client
    /// certificate) [default: the --cluster node].
    #[arg(long)]
    pub node: Option<u64>,
}

/// What `--json` prints and the summary line says.
#[derive(Serialize)]
pub(crate) struct DiffSummary {
    pub(crate) op: &'static str,
    pub(crate) vdi: String,
    pub(crate) from: Option<String>,
    pub(crate) to: String,
    pub(crate) file: String,
    pub(crate) node: u64,
    /// How the data reached the node: `unix`, `tcp` or `tls`.
    pub(crate) via: &'static str,
    /// Objects read and compared (export) or VDI size (import: 0).
    pub(crate) objects: u64,
    /// Bytes of data records.
    pub(crate) data_bytes: u64,
    /// Bytes the zero records cover.
    pub(crate) zero_bytes: u64,
    /// Size of the diff file.
    pub(crate) file_bytes: u64,
    pub(crate) seconds: f64,
    /// The snapshot of the VDI checked as the diff's base (import of an
    /// incremental diff).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) base: Option<String>,
    /// The snapshot taken after an import.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) snapshot: Option<String>,
}

impl DiffSummary {
    pub(crate) fn print(&self, ctx: &Ctx) -> Result<()> {
        // Under `-` the diff itself is on stdout: the summary goes to stderr.
        let to_stderr = self.file == "-" && self.op == "export-diff";
        if ctx.json {
            if to_stderr {
                eprintln!("{}", serde_json::to_string(self)?);
                return Ok(());
            }
            return print_json(self);
        }
        let mut line = match self.op {
            "export-diff" => format!(
                "Wrote the changes of '{}' {} to '{}' into {}: {} object(s) compared, {} of data, {} of zeros, a {} diff, in {:.1} s",
                self.vdi,
                self.from
                    .as_deref()
                    .map_or("from the start".to_string(), |f| format!("from '{f}'")),
                self.to,
                self.file,
                self.objects,
                format_size(self.data_bytes),
                format_size(self.zero_bytes),
                format_size(self.file_bytes),
                self.seconds
            ),
            _ => format!(
                "Applied {} ('{}' {}) to '{}'{}: {} of data, {} of zeros, in {:.1} s",
                self.file,
                self.to,
                self.from
                    .as_deref()
                    .map_or("in full".to_string(), |f| format!("since '{f}'")),
                self.vdi,
                self.base
                    .as_deref()
                    .map_or(String::new(), |b| format!(", checked on its base '{b}'")),
                format_size(self.data_bytes),
                format_size(self.zero_bytes),
                self.seconds
            ),
        };
        if let Some(s) = &self.snapshot {
            line.push_str(&format!("; snapshot '{s}' taken"));
        }
        if to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        Ok(())
    }
}

/// Every object index of `ids` that some up node stores. A node that does not
/// answer makes this fail (`why`: what would be missed without its list).
pub(crate) async fn stored_objects(ctx: &Ctx, ids: &[VdiId], why: &str) -> Result<BTreeSet<u32>> {
    let s: Status = ctx.get("/api/status").await?;
    let mut out = BTreeSet::new();
    let ids: Vec<String> = ids.iter().map(|id| id.0.to_string()).collect();
    let path = format!("/api/local/objects?vdis={}", ids.join(","));
    for n in s.map.nodes.values().filter(|n| n.state == NodeState::Up) {
        let got: LocalObjects = ctx
            .get_at(&n.admin_addr, &path)
            .await
            .with_context(|| format!("Node {} did not list its objects: {why}", n.id))?;
        out.extend(got.vdis.into_values().flatten());
    }
    Ok(out)
}

/// The diff's destination: a temporary file renamed at the end, or stdout.
enum Out {
    File {
        tmp: PathBuf,
        path: PathBuf,
        w: std::io::BufWriter<std::fs::File>,
    },
    Stdout(std::io::BufWriter<std::io::Stdout>),
}

impl Out {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Out::File { w, .. } => w as &mut dyn Write,
            Out::Stdout(w) => w as &mut dyn Write,
        }
    }
}

fn open_out(file: &std::path::Path, force: bool) -> Result<Out> {
    if file.as_os_str() == "-" {
        if std::io::stdout().is_terminal() {
            bail!("Refusing to write a diff to a terminal: give a FILE or redirect stdout");
        }
        return Ok(Out::Stdout(std::io::BufWriter::with_capacity(
            1 << 20,
            std::io::stdout(),
        )));
    }
    let shown = file.display();
    match std::fs::symlink_metadata(file) {
        Ok(m) if m.is_dir() => bail!("Cannot write '{shown}': it is a directory"),
        Ok(_) if !force => bail!("'{shown}' exists; pass --force to replace it"),
        _ => {}
    }
    let name = file
        .file_name()
        .ok_or_else(|| anyhow!("Cannot write '{shown}': not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".drove-{}.tmp", std::process::id()));
    let tmp = file.with_file_name(tmp_name);
    let f = std::fs::File::create(&tmp).with_context(|| format!("Cannot write '{shown}'"))?;
    Ok(Out::File {
        tmp,
        path: file.to_path_buf(),
        w: std::io::BufWriter::with_capacity(1 << 20, f),
    })
}

/// Make the diff durable and put it in place.
fn finish_out(out: Out) -> Result<()> {
    match out {
        Out::Stdout(mut w) => w.flush().context("Cannot write the diff to stdout"),
        Out::File { tmp, path, w } => {
            let res = (|| -> std::io::Result<()> {
                let f = w.into_inner().map_err(|e| e.into_error())?;
                f.sync_all()?;
                std::fs::rename(&tmp, &path)
            })();
            if let Err(e) = res {
                let _ = std::fs::remove_file(&tmp);
                bail!("Cannot write '{}': {e}", path.display());
            }
            Ok(())
        }
    }
}

pub async fn export_diff(a: ExportDiffArgs, ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    // Confirmed current: a snapshot taken a moment ago through another node counts.
    let vdis: Vec<VdiInfo> = ctx.get_consistent("/api/vdis").await?;
    let plan = plan(&vdis, &a.name, a.from.as_deref(), &a.to)?;
    let why = "without it the diff could miss some";
    let objects = stored_objects(ctx, &plan.ids, why).await?;
    let node = target_of(ctx, a.node).await?;
    let mut to_c = NbdClient::connect(&node.target, &plan.to.name).await?;
    if to_c.size() != plan.to.size {
        bail!(
            "Node {} serves '{}' as {} bytes, the metadata says {}",
            node.id,
            plan.to.name,
            to_c.size(),
            plan.to.size
        );
    }
    let mut from_c = match &plan.from {
        Some(f) => Some(NbdClient::connect(&node.target, &f.name).await?),
        None => None,
    };
    let mut out = open_out(&a.file, a.force)?;
    let res = write_diff(
        &plan,
        &objects,
        &mut to_c,
        from_c.as_mut(),
        out.writer(),
        ctx.json,
    )
    .await;
    let totals = match res {
        Ok(v) => v,
        Err(e) => {
            if let Out::File { tmp, .. } = &out {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
    };
    finish_out(out)?;
    let _ = to_c.disconnect().await;
    if let Some(c) = from_c {
        let _ = c.disconnect().await;
    }
    DiffSummary {
        op: "export-diff",
        vdi: a.name,
        from: plan.from.map(|f| f.name),
        to: plan.to.name,
        file: a.file.display().to_string(),
        node: node.id.0,
        via: node.target.via(),
        objects: objects.len() as u64,
        data_bytes: totals.data_bytes,
        zero_bytes: totals.zero_bytes,
        file_bytes: totals.file_bytes,
        seconds: t0.elapsed().as_secs_f64(),
        base: None,
        snapshot: None,
    }
    .print(ctx)
}

/// A snapshot as a diff records it.
fn snap_of(v: &VdiInfo) -> Snap {
    Snap {
        name: v.name.clone(),
        id: v.id.0,
        size: v.size,
        created: v.created,
    }
}

/// Read each of `objects` from TO (and FROM) and write the blocks that differ,
/// each changed object of an incremental diff preceded by the checksum of what FROM
/// holds there.
async fn write_diff(
    plan: &Plan,
    objects: &BTreeSet<u32>,
    to_c: &mut NbdClient,
    mut from_c: Option<&mut NbdClient>,
    w: &mut dyn Write,
    json: bool,
) -> Result<Totals> {
    let io = |e: std::io::Error| anyhow!("Cannot write the diff: {e}");
    let size = plan.to.size;
    let os = u64::from(plan.to.object_size);
    let header = Header {
        from: plan.from.as_ref().map(snap_of),
        to: snap_of(&plan.to),
        object_size: plan.to.object_size,
    };
    let mut d = DiffWriter::new(w, &header).map_err(io)?;
    let on = std::io::stderr().is_terminal() && !json;
    let total = objects.len() as u64 * os;
    let mut progress = Progress::new(total, "export-diff", on);
    let mut new = vec![0u8; os as usize];
    let mut old = vec![0u8; os as usize];
    for (i, &idx) in objects.iter().enumerate() {
        let start = u64::from(idx) * os;
        if start >= size {
            continue;
        }
        let len = os.min(size - start) as usize;
        to_c.read(start, &mut new[..len]).await?;
        let old = &mut old[..len];
        old.fill(0);
        if let (Some(c), Some(f)) = (from_c.as_deref_mut(), &plan.from) {
            if start < f.size {
                let n = (f.size - start).min(len as u64) as usize;
                c.read(start, &mut old[..n]).await?;
            }
        }
        let runs = changed_runs(&new[..len], old);
        if !runs.is_empty() && plan.from.is_some() {
            d.base(start, len as u64, &sha256(old)).map_err(io)?;
        }
        for run in runs {
            match run {
                Run::Data { offset, data } => d.data(start + offset, &data),
                Run::Zero { offset, len } => d.zero(start + offset, len),
            }
            .map_err(io)?;
        }
        progress.update((i + 1) as f64 * 100.0 / objects.len().max(1) as f64);
    }
    let (_, totals) = d.finish().map_err(io)?;
    progress.finish();
    Ok(totals)
}
