//! `drove vdi export NAME -` and `drove vdi import - NAME --size SIZE`: raw disk bytes
//! through a pipe, for backups sent elsewhere (`| zstd > disk.zst`, `| ssh host ...`).
//! qemu-img needs files it can seek in; nbdcopy (libnbd) reads and writes pipes, so it
//! moves the data between the pipe and a node's NBD endpoint, the same door QEMU uses.
//! drove stands between nbdcopy and its own stdin or stdout: it counts the bytes (for
//! the progress line, and to refuse more input than the VDI holds) and reports
//! nbdcopy's own error when it fails. A failed import deletes the VDI it made.
use anyhow::{anyhow, bail, Context, Result};
use drove_daemon::api::VdiDetail;
use drove_types::parse_size;
use std::io::IsTerminal;
use std::process::Stdio;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::client::Ctx;
use crate::nbd_target::explain;
use crate::qemu_img::Progress;
use crate::transfer::{
    endpoint, wait_visible, with_new_vdi, ExportArgs, Format, ImportArgs, Summary,
};

/// Bytes moved per read.
const CHUNK: usize = 1 << 20;

fn nbdcopy() -> Command {
    let mut c = Command::new("nbdcopy");
    c.kill_on_drop(true);
    c
}

fn spawn_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        anyhow!("nbdcopy is not installed (Debian: apt-get install libnbd-bin)")
    } else {
        anyhow!("Cannot run nbdcopy: {e}")
    }
}

/// Everything a child printed on its stderr, read in the background.
fn collect(mut err: impl AsyncRead + Unpin + Send + 'static) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b).await;
        let t = String::from_utf8_lossy(&b);
        let lines: Vec<&str> = t
            .lines()
            .map(|l| l.trim().trim_start_matches("nbdcopy: "))
            .filter(|l| !l.is_empty())
            .collect();
        lines[lines.len().saturating_sub(3)..].join("; ")
    })
}

fn percent(done: u64, size: u64) -> f64 {
    (done as f64 * 100.0 / size.max(1) as f64).min(100.0)
}

/// `drove vdi export NAME -`: the VDI's bytes, raw, on stdout.
pub(crate) async fn export(a: ExportArgs, ctx: &Ctx) -> Result<()> {
    if !matches!(a.format, Format::Raw) {
        bail!(
            "Only raw bytes go to stdout (`-`): qcow2 needs a file it can seek in; export \
             to a FILE for qcow2"
        );
    }
    if std::io::stdout().is_terminal() {
        bail!(
            "Not writing a disk image to a terminal: redirect stdout, e.g. `drove vdi \
             export {0} - > {0}.raw` or `| ssh HOST ...`",
            a.name
        );
    }
    let d: VdiDetail = ctx.get(&format!("/api/vdis/{}", a.name)).await?;
    let size = d.info.size;
    let ep = endpoint(ctx, a.node, &a.name).await?;
    wait_visible(ctx, &ep.admin, &a.name).await?;
    let start = Instant::now();
    let mut child = nbdcopy()
        .args(["--", &ep.libnbd_uri, "-"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    let (Some(mut from), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        bail!("nbdcopy started without its pipes");
    };
    let errs = collect(err);
    let label = format!("export {}", a.name);
    let mut bar = Progress::new(size, &label, !ctx.json && std::io::stderr().is_terminal());
    let mut total = 0u64;
    let copy = async {
        let mut out = tokio::io::stdout();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await.context("Reading from nbdcopy")?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])
                .await
                .context("Writing to stdout")?;
            total += n as u64;
            bar.update(percent(total, size));
        }
        out.flush().await.context("Writing to stdout")?;
        child.wait().await.context("Waiting for nbdcopy")
    };
    let status = tokio::select! {
        s = copy => s,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    bar.finish();
    let status = status.with_context(|| format!("Export of VDI '{}' failed", a.name))?;
    if !status.success() {
        let said = anyhow!("nbdcopy: {}", errs.await.unwrap_or_default());
        return Err(explain(&ep.target, ep.node, said).context(format!(
            "Export of VDI '{}' failed after {total} bytes",
            a.name
        )));
    }
    if total != size {
        bail!(
            "Export of VDI '{}' ended after {total} of its {size} bytes",
            a.name
        );
    }
    let secs = start.elapsed().as_secs_f64();
    Summary::new("export", &a.name, "-".into(), "raw", &ep, size, None, secs).print(ctx)
}

/// `drove vdi import - NAME --size SIZE`: a new VDI from raw bytes on stdin.
pub(crate) async fn import(a: ImportArgs, ctx: &Ctx) -> Result<()> {
    if matches!(a.format, Some(Format::Qcow2)) {
        bail!(
            "stdin (`-`) is read as raw bytes only: qcow2 needs a file it can seek in; \
             import the qcow2 FILE instead"
        );
    }
    let Some(size) = &a.size else {
        bail!(
            "An import from stdin (`-`) needs --size (e.g. --size 10G): a pipe does not \
             say how long it is"
        );
    };
    let size = parse_size(size)?;
    if size == 0 {
        return Err(crate::fail::invalid(
            "Bad --size: a VDI needs at least 1 byte",
        ));
    }
    if std::io::stdin().is_terminal() {
        bail!(
            "Not reading a disk image from a terminal: pipe one in, e.g. `zstdcat disk.zst \
             | drove vdi import - {} --size SIZE`",
            a.name
        );
    }
    // nbdcopy may end early (a refused write): writing into its closed stdin must be
    // an error this process handles (it deletes the VDI), not a silent SIGPIPE death.
    ignore_sigpipe();
    let json = ctx.json;
    let name = a.name.clone();
    let (ep, (total, secs)) = with_new_vdi(ctx, &a, size, "-", |ep| async move {
        let start = Instant::now();
        let mut child = nbdcopy()
            .args([
                "--flush",
                "--destination-is-zero",
                "--",
                "-",
                &ep.libnbd_uri,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let (Some(mut to), Some(err)) = (child.stdin.take(), child.stderr.take()) else {
            bail!("nbdcopy started without its pipes");
        };
        let errs = collect(err);
        let label = format!("import {name}");
        let mut bar = Progress::new(size, &label, !json && std::io::stderr().is_terminal());
        let mut total = 0u64;
        let copy = async {
            let mut input = tokio::io::stdin();
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = input.read(&mut buf).await.context("Reading stdin")?;
                if n == 0 {
                    break;
                }
                if total + n as u64 > size {
                    bail!("stdin has more than the {size} bytes of --size");
                }
                if let Err(e) = to.write_all(&buf[..n]).await {
                    // nbdcopy ended: its own message says why.
                    let _ = child.wait().await;
                    bail!("nbdcopy stopped reading ({e})");
                }
                total += n as u64;
                bar.update(percent(total, size));
            }
            to.shutdown().await.context("Closing nbdcopy's input")?;
            drop(to);
            child.wait().await.context("Waiting for nbdcopy")
        };
        let status = tokio::select! {
            s = copy => s,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        };
        bar.finish();
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                let said = errs.await.unwrap_or_default();
                if said.is_empty() {
                    return Err(e);
                }
                return Err(e.context(format!("nbdcopy: {said}")));
            }
        };
        if !status.success() {
            bail!("nbdcopy: {}", errs.await.unwrap_or_default());
        }
        Ok((total, start.elapsed().as_secs_f64()))
    })
    .await?;
    Summary::new("import", &a.name, "-".into(), "raw", &ep, total, None, secs).print(ctx)
}

fn ignore_sigpipe() {
    // SAFETY: SIG_IGN installs no handler code; writes to a closed pipe then fail
    // with EPIPE instead of ending the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
