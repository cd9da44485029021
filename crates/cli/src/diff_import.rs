//! `drove vdi import-diff FILE NAME`: apply a diff of `export-diff` to a VDI, checking
//! everything that can be checked before the first write:
//!
//! 1. The whole file: every record's CRC, the order and extents of the records, and
//!    the end record's SHA-256 over the file ([`crate::diff_format::verify`]). From
//!    stdin the diff is first kept in an unlinked temporary file, so that it too is
//!    checked whole before anything is written.
//! 2. A full diff creates NAME (which must not exist). An incremental diff applies
//!    only to a VDI that holds its base: NAME must come from the snapshot named by
//!    `--base` (default: the diff's FROM name) with nothing written since (no node
//!    stores an object of NAME's own id), be FROM's size, and hold, in every range the
//!    diff changes, exactly the bytes FROM held there (their SHA-256 is in the diff).
//!    A VDI that never had the base is refused, unchanged (it is neither grown nor
//!    written).
//! 3. Then the VDI is grown to TO's size, the records are written through NBD (each
//!    record's CRC checked again as it is read), and the writes are flushed.
//!
//! Only a failure of the cluster or of the file in the middle of step 3 leaves NAME
//! partly written; the message then says how to bring it back (a created VDI is
//! deleted again; an existing one is rolled back to its base snapshot).
use anyhow::{anyhow, bail, Context, Result};
use drove_daemon::api::{self, CreateVdi, Snapshotted, VdiDetail};
use drove_types::{validate_name, VdiInfo};
use std::io::{IsTerminal, Read, Seek};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::client::Ctx;
use crate::diff_cmd::{stored_objects, DiffSummary, ImportDiffArgs};
use crate::diff_format::{sha256, verify, BaseRange, DiffReader, Header, Item, Snap, Totals};
use crate::nbd_client::NbdClient;
use crate::nbd_target::{target_of, NodeNbd, Target};
use crate::qemu_img::Progress;
use crate::transfer::{delete_vdi, wait_visible};
use crate::vdi_cmd::encode;

pub async fn import_diff(a: ImportDiffArgs, ctx: &Ctx) -> Result<()> {
    let t0 = Instant::now();
    validate_name(&a.name)?;
    for n in [&a.snapshot, &a.base].into_iter().flatten() {
        validate_name(n)?;
    }
    if let Some(c) = a.copies {
        if c == 0 || c > drove_types::MAX_COPIES {
            bail!("Bad --copies {c}: use 1 to {}", drove_types::MAX_COPIES);
        }
    }
    let shown = a.file.display().to_string();
    let mut file = open_input(&a.file)?;
    let (header, bases, totals) = verify(std::io::BufReader::with_capacity(1 << 20, &file))
        .with_context(|| format!("Cannot apply '{shown}'; nothing was written"))?;
    // Confirmed current: the base check must not judge a VDI by a record a
    // snapshot taken a moment ago through another node has replaced.
    let vdis: Vec<VdiInfo> = ctx.get_consistent("/api/vdis").await?;
    let existing = vdis.iter().find(|v| v.name == a.name);
    let node = target_of(ctx, a.node).await?;
    let base = match &header.from {
        None => {
            if let Some(b) = &a.base {
                bail!(
                    "'{shown}' is a full diff (of '{}'): it has no base; leave out --base {b}",
                    header.to.name
                );
            }
            if existing.is_some() {
                bail!(
                    "'{shown}' is a full diff (of '{}'), applied only to a new VDI: '{}' exists; choose another NAME",
                    header.to.name,
                    a.name
                );
            }
            create(ctx, &a, &header).await?;
            None
        }
        Some(from) => {
            let Some(v) = existing else {
                bail!(
                    "'{shown}' holds only what changed since snapshot '{}': it applies to a VDI \
                     that holds what '{}' held, and there is no VDI '{}'. Restore the full \
                     diff first (`drove vdi import-diff FULL.diff {} --snapshot SNAP`), then \
                     this one with --base SNAP",
                    from.name,
                    from.name,
                    a.name,
                    a.name
                );
            };
            let base = check_base(ctx, &vdis, v, from, a.base.as_deref(), &bases, &node).await?;
            if header.to.size > v.size {
                let _: VdiDetail = ctx
                    .post(
                        &format!("/api/vdis/{}/resize", encode(&a.name)),
                        &api::Resize {
                            size: header.to.size,
                            grow: false,
                        },
                    )
                    .await
                    .with_context(|| format!("Cannot grow '{}' to the diff's size", a.name))?;
            }
            Some(base)
        }
    };
    let applied = async {
        if base.is_none() {
            wait_visible(ctx, &node.admin, &a.name).await?;
        }
        file.rewind().context("Cannot read the diff again")?;
        let r = std::io::BufReader::with_capacity(1 << 20, &file);
        apply(r, &header, &node.target, &a.name, totals, ctx.json).await
    }
    .await;
    if let Err(e) = applied {
        return Err(match &base {
            None => match delete_vdi(ctx, &a.name).await {
                Ok(_) => e.context(format!(
                    "Import of '{shown}' failed; the VDI '{}' it created is deleted again",
                    a.name
                )),
                Err(d) => e.context(format!(
                    "Import of '{shown}' failed; deleting the VDI '{}' it created failed too ({d:#}): run `drove vdi delete {}`",
                    a.name, a.name
                )),
            },
            Some(b) => e.context(format!(
                "Import of '{shown}' failed part way: '{0}' is partly updated. `drove vdi \
                 rollback {0} {b}` brings it back to its base; then run this import-diff again",
                a.name
            )),
        });
    }
    if let Some(snap) = &a.snapshot {
        take_snapshot(ctx, &node.admin, &a.name, snap).await?;
    }
    DiffSummary {
        op: "import-diff",
        vdi: a.name,
        from: header.from.map(|f| f.name),
        to: header.to.name,
        file: shown,
        node: node.id.0,
        via: node.target.via(),
        objects: 0,
        data_bytes: totals.data_bytes,
        zero_bytes: totals.zero_bytes,
        file_bytes: totals.file_bytes,
        seconds: t0.elapsed().as_secs_f64(),
        base,
        snapshot: a.snapshot,
    }
    .print(ctx)
}

/// The diff as a file that can be read twice: FILE, or stdin kept in an unlinked
/// temporary file.
fn open_input(file: &Path) -> Result<std::fs::File> {
    let shown = file.display();
    if file.as_os_str() != "-" {
        return std::fs::File::open(file).with_context(|| format!("Cannot read '{shown}'"));
    }
    if std::io::stdin().is_terminal() {
        bail!("Not reading a diff from a terminal: give a FILE or pipe one in");
    }
    let keep = |e: std::io::Error| {
        anyhow!(
            "Cannot keep the diff from stdin in a temporary file in {} (it is checked \
             whole before anything is written): {e}",
            std::env::temp_dir().display()
        )
    };
    let mut t = tempfile::tempfile().map_err(keep)?;
    std::io::copy(&mut std::io::stdin().lock(), &mut t).map_err(keep)?;
    t.rewind().map_err(keep)?;
    Ok(t)
}

/// Create the VDI a full diff restores.
async fn create(ctx: &Ctx, a: &ImportDiffArgs, header: &Header) -> Result<()> {
    let _: VdiDetail = ctx
        .post(
            "/api/vdis",
            &CreateVdi {
                name: a.name.clone(),
                size: header.to.size,
                copies: a.copies,
                mode: Default::default(),
                min_copies: None,
                home_zone: None,
                home_copies: None,
                write: Default::default(),
                qos: Default::default(),
            },
        )
        .await?;
    Ok(())
}

/// Check that `v` holds the diff's base `from`; the name of the snapshot it was
/// checked against.
async fn check_base(
    ctx: &Ctx,
    vdis: &[VdiInfo],
    v: &VdiInfo,
    from: &Snap,
    named: Option<&str>,
    bases: &[BaseRange],
    node: &NodeNbd,
) -> Result<String> {
    let name = &v.name;
    if v.snapshot {
        bail!("'{name}' is a snapshot (read-only)");
    }
    let want = named.unwrap_or(&from.name);
    let parent = v.parent.and_then(|p| vdis.iter().find(|x| x.id == p));
    let Some(p) = parent.filter(|p| p.name == want) else {
        let had = parent.map_or("it has no snapshot".to_string(), |p| {
            format!("it comes from snapshot '{}'", p.name)
        });
        if named.is_some() {
            bail!("'{name}' does not come from snapshot '{want}' ({had}); nothing was written");
        }
        bail!(
            "The diff applies on top of snapshot '{}', and '{name}' does not come from a \
             snapshot of that name ({had}). If a snapshot of '{name}' holds what '{}' held \
             (the --snapshot of the import-diff before this one), name it with --base; \
             nothing was written",
            from.name,
            from.name
        );
    };
    let written = stored_objects(
        ctx,
        &[v.id],
        "without it, writes to the VDI since its base could go unseen",
    )
    .await?;
    if !written.is_empty() {
        bail!(
            "'{name}' was written since snapshot '{want}' ({} object(s)), so it no longer \
             holds the diff's base: `drove vdi rollback {name} {want}` brings it back; \
             nothing was written",
            written.len()
        );
    }
    if v.size != from.size {
        bail!(
            "'{name}' is {} bytes and the diff's base '{}' was {} bytes: '{want}' is not \
             that base; nothing was written",
            v.size,
            from.name,
            from.size
        );
    }
    let differ = differing_ranges(&node.target, name, v.size, bases, ctx.json).await?;
    if let Some((first, n)) = differ {
        bail!(
            "'{name}' does not hold what the diff's base '{}' held: {n} of the {} range(s) \
             the diff changes differ (the first at offset {first}), so '{}' is not its \
             base; nothing was written",
            from.name,
            bases.len(),
            p.name
        );
    }
    Ok(p.name.clone())
}

/// Read each base range from VDI `name` (`size` bytes; zeros past it) and compare
/// it with the diff's checksum: the first differing offset and how many differ.
async fn differing_ranges(
    target: &Target,
    name: &str,
    size: u64,
    bases: &[BaseRange],
    json: bool,
) -> Result<Option<(u64, usize)>> {
    if bases.is_empty() {
        return Ok(None);
    }
    let mut c = NbdClient::connect(target, name).await?;
    let total: u64 = bases.iter().map(|b| b.len).sum();
    let on = std::io::stderr().is_terminal() && !json;
    let mut progress = Progress::new(total, "import-diff: checking the base", on);
    let (mut first, mut n, mut done) = (None, 0usize, 0u64);
    let mut buf = Vec::new();
    for b in bases {
        buf.clear();
        buf.resize(b.len as usize, 0);
        let here = size.saturating_sub(b.offset).min(b.len) as usize;
        if here > 0 {
            c.read(b.offset, &mut buf[..here]).await?;
        }
        if sha256(&buf) != b.sha256 {
            first.get_or_insert(b.offset);
            n += 1;
        }
        done += b.len;
        progress.update(done as f64 * 100.0 / total.max(1) as f64);
    }
    progress.finish();
    let _ = c.disconnect().await;
    Ok(first.map(|f| (f, n)))
}

/// Write every record of the diff in `r` (the one `verify` read: `header`, `totals`)
/// into `name` through `target`, then flush.
async fn apply<R: Read>(
    r: R,
    header: &Header,
    target: &Target,
    name: &str,
    totals: Totals,
    json: bool,
) -> Result<()> {
    let mut reader = DiffReader::open(r)?;
    if reader.header() != header {
        bail!("The diff changed while it was being applied");
    }
    let mut c = NbdClient::connect(target, name).await?;
    if c.read_only() {
        bail!("'{name}' is served read-only");
    }
    if c.size() < header.to.size {
        bail!(
            "'{name}' is served as {} bytes, smaller than the diff's {}",
            c.size(),
            header.to.size
        );
    }
    let on = std::io::stderr().is_terminal() && !json;
    let mut progress = Progress::new(totals.file_bytes, "import-diff", on);
    while let Some(item) = reader.next_item()? {
        match item {
            Item::Base(_) => {}
            Item::Data { offset, data } => c.write(offset, &data).await?,
            Item::Zero { offset, len } => c.write_zeroes(offset, len).await?,
        }
        progress.update(reader.consumed as f64 * 100.0 / totals.file_bytes.max(1) as f64);
    }
    if reader.totals() != totals {
        bail!("The diff changed while it was being applied");
    }
    c.flush().await?;
    c.disconnect().await?;
    progress.finish();
    Ok(())
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
