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
//! import-diff writes the blocks into a VDI through NBD, then flushes; a full diff
//! (made without --from) creates the VDI. Applying a diff twice is harmless (every
//! record is absolute), so a failed import is finished by running it again.
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use drove_daemon::api::{self, CreateVdi, LocalObjects, Snapshotted, Status, VdiDetail};
use drove_types::{format_size, validate_name, NodeState, VdiInfo};
use serde::Serialize;
use std::collections::BTreeSet;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::client::{print_json, Ctx};
use crate::diff_format::{changed_runs, plan, write_record, DiffReader, Plan, Record, MAGIC};
use crate::nbd_client::NbdClient;
use crate::nbd_target::target_of;
use crate::qemu_img::Progress;
use crate::vdi_cmd::encode;

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
    /// A diff export-diff wrote, or `-` for stdin.
    pub file: PathBuf,
    /// The VDI to apply it to. A full diff creates it (it must not exist); an
    /// incremental one applies to the VDI that holds what its --from snapshot held
    /// (the VDI the diffs before it were applied to, in order: import-diff cannot
    /// check that).
    pub name: String,
    /// Then take a snapshot of NAME with this name (the base the next incremental
    /// diff applies to, e.g. named as the diff's --to).
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
struct DiffSummary {
    op: &'static str,
    vdi: String,
    from: Option<String>,
    to: String,
    file: String,
    node: u64,
    /// How the data reached the node: `unix`, `tcp` or `tls`.
    via: &'static str,
    /// Objects read and compared (export) or VDI size (import: 0).
    objects: u64,
    /// Bytes of data records.
    data_bytes: u64,
    /// Bytes the zero records cover.
    zero_bytes: u64,
    /// Size of the diff file.
    file_bytes: u64,
    seconds: f64,
    /// The snapshot taken after an import.
    #[serde(skip_serializing_if = "Option::is_none")]
    snapshot: Option<String>,
}

impl DiffSummary {
    fn print(&self, ctx: &Ctx) -> Result<()> {
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
                "Applied {} ('{}' {}) to '{}': {} of data, {} of zeros, in {:.1} s",
                self.file,
                self.to,
                self.from
                    .as_deref()
                    .map_or("in full".to_string(), |f| format!("since '{f}'")),
                self.vdi,
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

/// Every object index of `plan`'s ids that some up node stores. A node that does
/// not answer makes this fail: an object only it stores would be missing from the
/// diff.
async fn changed_objects(ctx: &Ctx, plan: &Plan) -> Result<BTreeSet<u32>> {
    let s: Status = ctx.get("/api/status").await?;
    let mut out = BTreeSet::new();
    let ids: Vec<String> = plan.ids.iter().map(|id| id.0.to_string()).collect();
    let path = format!("/api/local/objects?vdis={}", ids.join(","));
    for n in s.map.nodes.values().filter(|n| n.state == NodeState::Up) {
        let got: LocalObjects = ctx.get_at(&n.admin_addr, &path).await.with_context(|| {
            format!(
                "Node {} did not list its objects: without it the diff could miss some",
                n.id
            )
        })?;
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
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    let plan = plan(&vdis, &a.name, a.from.as_deref(), &a.to)?;
    let objects = changed_objects(ctx, &plan).await?;
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
    let (data_bytes, zero_bytes, file_bytes) = match res {
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
        data_bytes,
        zero_bytes,
        file_bytes,
        seconds: t0.elapsed().as_secs_f64(),
        snapshot: None,
    }
    .print(ctx)
}

/// Read each of `objects` from TO (and FROM), write the blocks that differ;
/// (data bytes, zero bytes, file bytes).
async fn write_diff(
    plan: &Plan,
    objects: &BTreeSet<u32>,
    to_c: &mut NbdClient,
    mut from_c: Option<&mut NbdClient>,
    w: &mut dyn Write,
    json: bool,
) -> Result<(u64, u64, u64)> {
    let io = |e: std::io::Error| anyhow!("Cannot write the diff: {e}");
    let size = plan.to.size;
    let os = u64::from(plan.to.object_size);
    let mut file_bytes = w.write_all(MAGIC).map(|_| MAGIC.len() as u64).map_err(io)?;
    if let Some(f) = &plan.from {
        file_bytes += write_record(w, &Record::From(f.name.clone())).map_err(io)?;
    }
    file_bytes += write_record(w, &Record::To(plan.to.name.clone())).map_err(io)?;
    file_bytes += write_record(w, &Record::Size(size)).map_err(io)?;
    let on = std::io::stderr().is_terminal() && !json;
    let total = objects.len() as u64 * os;
    let mut progress = Progress::new(total, "export-diff", on);
    let mut new = vec![0u8; os as usize];
    let mut old = vec![0u8; os as usize];
    let (mut data_bytes, mut zero_bytes) = (0u64, 0u64);
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
        for run in changed_runs(&new[..len], old) {
            let rec = match run {
                Record::Data { offset, data } => {
                    data_bytes += data.len() as u64;
                    Record::Data {
                        offset: start + offset,
                        data,
                    }
                }
                Record::Zero { offset, len } => {
                    zero_bytes += len;
                    Record::Zero {
                        offset: start + offset,
                        len,
                    }
                }
                other => other,
            };
            file_bytes += write_record(w, &rec).map_err(io)?;
        }
        progress.update((i + 1) as f64 * 100.0 / objects.len().max(1) as f64);
    }
    file_bytes += write_record(w, &Record::End).map_err(io)?;
    progress.finish();
    Ok((data_bytes, zero_bytes, file_bytes))
}

pub async fn import_diff(a: ImportDiffArgs, ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    validate_name(&a.name)?;
    if let Some(s) = &a.snapshot {
        validate_name(s)?;
    }
    if let Some(c) = a.copies {
        if c == 0 || c > drove_types::MAX_COPIES {
            bail!("Bad --copies {c}: use 1 to {}", drove_types::MAX_COPIES);
        }
    }
    let shown = a.file.display().to_string();
    let (input, total): (Box<dyn Read + Send>, Option<u64>) = if a.file.as_os_str() == "-" {
        (Box::new(std::io::stdin()), None)
    } else {
        let f = std::fs::File::open(&a.file).with_context(|| format!("Cannot read '{shown}'"))?;
        let len = f.metadata().ok().map(|m| m.len());
        (Box::new(f), len)
    };
    let (mut reader, header) = DiffReader::open(std::io::BufReader::with_capacity(1 << 20, input))
        .with_context(|| format!("Cannot read '{shown}'"))?;
    let vdis: Vec<VdiInfo> = ctx.get("/api/vdis").await?;
    let existing = vdis.iter().find(|v| v.name == a.name);
    let mut created = false;
    match (existing, &header.from) {
        (Some(_), None) => bail!(
            "'{shown}' is a full diff (of '{}'), applied only to a new VDI: '{}' exists; choose another NAME",
            header.to,
            a.name
        ),
        (None, Some(f)) => bail!(
            "'{shown}' holds only what changed since snapshot '{f}': apply it to the VDI the diffs before it were applied to; there is no VDI '{}'",
            a.name
        ),
        (Some(v), Some(_)) => {
            if v.snapshot {
                bail!("'{}' is a snapshot (read-only)", a.name);
            }
            if v.size > header.size {
                bail!(
                    "'{}' is {} bytes, larger than the diff's '{}' ({} bytes): it is not the VDI this diff belongs to",
                    a.name,
                    v.size,
                    header.to,
                    header.size
                );
            }
            if v.size < header.size {
                let _: VdiDetail = ctx
                    .post(
                        &format!("/api/vdis/{}/resize", encode(&a.name)),
                        &api::Resize {
                            size: header.size,
                            grow: false,
                        },
                    )
                    .await
                    .with_context(|| format!("Cannot grow '{}' to the diff's size", a.name))?;
            }
        }
        (None, None) => {
            let _: VdiDetail = ctx
                .post(
                    "/api/vdis",
                    &CreateVdi {
                        name: a.name.clone(),
                        size: header.size,
                        copies: a.copies,
                        mode: Default::default(),
                        min_copies: None,
                        home_zone: None,
                        home_copies: None,
                        write: Default::default(),
                    },
                )
                .await?;
            created = true;
        }
    }
    let node = target_of(ctx, a.node).await?;
    let applied = async {
        if created {
            crate::transfer::wait_visible(ctx, &node.admin, &a.name).await?;
        }
        apply(
            &mut reader,
            &node.target,
            &a.name,
            header.size,
            total,
            ctx.json,
        )
        .await
    }
    .await;
    let (data_bytes, zero_bytes) = match applied {
        Ok(v) => v,
        Err(e) if created => {
            let d = crate::transfer::delete_vdi(ctx, &a.name).await;
            return Err(match d {
                Ok(_) => e.context(format!(
                    "Import of '{shown}' failed; the VDI '{}' it created is deleted again",
                    a.name
                )),
                Err(d) => e.context(format!(
                    "Import of '{shown}' failed; deleting the VDI '{}' it created failed too ({d:#}): run `drove vdi delete {}`",
                    a.name, a.name
                )),
            });
        }
        Err(e) => {
            return Err(e.context(format!(
                "Import of '{shown}' failed part way: '{}' is partly updated; running the same import-diff again finishes it (a diff applied twice gives the same disk)",
                a.name
            )))
        }
    };
    if let Some(snap) = &a.snapshot {
        take_snapshot(ctx, &node.admin, &a.name, snap).await?;
    }
    DiffSummary {
        op: "import-diff",
        vdi: a.name,
        from: header.from,
        to: header.to,
        file: shown,
        node: node.id.0,
        via: node.target.via(),
        objects: 0,
        data_bytes,
        zero_bytes,
        file_bytes: reader.consumed,
        seconds: t0.elapsed().as_secs_f64(),
        snapshot: a.snapshot,
    }
    .print(ctx)
}

/// Write every record of `reader` into `name` through `target`, then flush.
async fn apply<R: Read>(
    reader: &mut DiffReader<R>,
    target: &crate::nbd_client::Target,
    name: &str,
    size: u64,
    total: Option<u64>,
    json: bool,
) -> Result<(u64, u64)> {
    let mut c = NbdClient::connect(target, name).await?;
    if c.read_only() {
        bail!("'{name}' is served read-only");
    }
    if c.size() < size {
        bail!(
            "'{name}' is served as {} bytes, smaller than the diff's {size}",
            c.size()
        );
    }
    let on = std::io::stderr().is_terminal() && !json && total.is_some();
    let mut progress = Progress::new(total.unwrap_or(0), "import-diff", on);
    let (mut data_bytes, mut zero_bytes) = (0u64, 0u64);
    while let Some(rec) = reader.next_record()? {
        match rec {
            Record::Data { offset, data } => {
                c.write(offset, &data).await?;
                data_bytes += data.len() as u64;
            }
            Record::Zero { offset, len } => {
                c.write_zeroes(offset, len).await?;
                zero_bytes += len;
            }
            other => bail!("Unexpected record {other:?}"),
        }
        if let Some(t) = total {
            progress.update(reader.consumed as f64 * 100.0 / t.max(1) as f64);
        }
    }
    c.flush().await?;
    c.disconnect().await?;
    progress.finish();
    Ok((data_bytes, zero_bytes))
}

/// Snapshot `name` as `snap` once the import's connection let go of its lock (the
/// release reaches the metadata a moment after the disconnect).
async fn take_snapshot(ctx: &Ctx, admin: &str, name: &str, snap: &str) -> Result<()> {
    let path = format!("/api/vdis/{}/snapshot", encode(name));
    let body = api::Snapshot {
        snap: snap.to_string(),
    };
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        match ctx
            .post_at_long::<_, Snapshotted>(admin, &path, &body, Duration::from_secs(60))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < end && e.to_string().contains("lock") => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(e.context(format!(
                    "The diff is applied to '{name}', but the snapshot '{snap}' was not taken: run `drove vdi snapshot {name} {snap}`"
                )))
            }
        }
    }
}
