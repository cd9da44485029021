//! A file system that really loses what was not synced, for the power-loss test:
//! outagefs (a Rust crate, MIT; installed by scripts/install-deps.sh) exposes an ext4
//! image as one FUSE file, the test mounts that file through a loop device (a real
//! kernel, ext4 journal and page cache), and outagefs records every write and every
//! fsync (the loop device's FLUSH) that reaches it. Replaying the recording with a
//! filter keeps some writes and drops the others: the state a disk with a volatile
//! write cache can be left in by a power cut.
//!
//! A cut keeps every write before some Sync (a FLUSH the disk completed) and any
//! subset of the writes between that Sync and the next one (those the cache may or
//! may not have written back when the power went), or keeps a plain prefix of the
//! writes (an in-order disk). The mounted image (`scripts/outagefs-hold.sh`) stays up
//! until [`Held::release`], so the test can run node processes in it.
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The helper script that mounts an image, says "mounted" and waits for a line.
fn hold_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/outagefs-hold.sh")
}

/// Why the power-loss test cannot run here, if it cannot.
pub fn probe() -> Result<(), String> {
    if !super::is_root() {
        return Err("not root (mounting an ext4 image needs it)".into());
    }
    for tool in [
        "outagefs",
        "mkfs.ext4",
        "losetup",
        "mount",
        "umount",
        "qemu-img",
        "qemu-io",
    ] {
        if !super::on_path(tool) {
            return Err(format!("{tool} is not installed"));
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing (no FUSE)".into());
    }
    // Debian's python3-libnbd is for /usr/bin/python3, not another python3 on PATH.
    let o = Command::new("/usr/bin/python3")
        .args(["-c", "import nbd"])
        .output()
        .map_err(|e| format!("/usr/bin/python3: {e}"))?;
    if !o.status.success() {
        return Err("python3-libnbd is not installed (/usr/bin/python3 cannot import nbd)".into());
    }
    Ok(())
}

/// A fresh ext4 image of `mib` MiB at `path`.
pub fn make_image(path: &Path, mib: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(mib << 20).unwrap();
    let o = super::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(path));
    assert!(o.status.success(), "mkfs.ext4: {}", super::text(&o));
}

/// An image mounted on a directory, held until [`Held::release`].
pub struct Held {
    child: Child,
    stdin: Option<ChildStdin>,
    mnt: PathBuf,
    log: PathBuf,
    released: bool,
}

impl Held {
    /// `image` (a plain file) mounted on `mnt`: what outagefs records from is made so.
    pub fn plain(image: &Path, mnt: &Path, log: &Path) -> Held {
        let mut cmd = Command::new(hold_script());
        cmd.arg(image).arg(mnt);
        Self::start(cmd, mnt, log)
    }

    /// `dir/base` mounted on `mnt` through outagefs, which records every write and
    /// fsync into `dir/changes` (saved when released).
    pub fn record(dir: &Path, mnt: &Path, log: &Path) -> Held {
        Self::start(outagefs(dir, mnt, &["--record"]), mnt, log)
    }

    /// `dir/base` with the recorded changes `filter` keeps, mounted on `mnt`; what is
    /// written to it now is forgotten when released.
    pub fn replay(dir: &Path, mnt: &Path, filter: &str, log: &Path) -> Held {
        Self::start(outagefs(dir, mnt, &["--filter", filter]), mnt, log)
    }

    fn start(mut cmd: Command, mnt: &Path, log: &Path) -> Held {
        std::fs::create_dir_all(mnt).unwrap();
        let err = std::fs::File::create(log).unwrap();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let mut held = Held {
            child,
            stdin,
            mnt: mnt.to_path_buf(),
            log: log.to_path_buf(),
            released: false,
        };
        if line.trim() != "mounted" {
            held.released = true;
            let _ = held.child.wait();
            panic!(
                "mounting the image on {} failed: {}",
                mnt.display(),
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        held
    }

    /// Unmount (the test stopped everything working in it) and wait for outagefs to
    /// save its recording, if it records.
    pub fn release(mut self) {
        self.released = true;
        let status = self.finish(Duration::from_secs(120));
        assert!(
            status == Some(true),
            "unmounting {} failed ({status:?}): {}",
            self.mnt.display(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Send the line that unmounts, then wait up to `patience` for the holder to end:
    /// whether it succeeded, `None` when it did not end.
    fn finish(&mut self, patience: Duration) -> Option<bool> {
        if let Some(mut s) = self.stdin.take() {
            let _ = writeln!(s);
        }
        let end = Instant::now() + patience;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.success());
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Held {
    /// A test that failed half-way still unmounts, so no loop device or FUSE mount
    /// outlives it (a FUSE file whose server is killed under a mounted loop device
    /// hangs whoever touches it).
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if self.finish(Duration::from_secs(60)).is_none() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            let _ = self.finish(Duration::from_secs(30));
        }
    }
}

/// `outagefs mount` of `dir/base` + `dir/changes` with the hold script as --exec.
fn outagefs(dir: &Path, mnt: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new("outagefs");
    cmd.arg("mount")
        .args(extra)
        .arg("--base")
        .arg(dir.join("base"))
        .arg("--changes")
        .arg(dir.join("changes"))
        .arg("--dest")
        .arg(dir.join("dev"))
        .arg("--exec")
        .arg(format!(
            "{} \"$1\" {}",
            hold_script().display(),
            mnt.display()
        ));
    cmd
}

/// One recorded change: a write reached the image, or it was synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Write,
    Sync,
}

/// The recording in `dir` (`outagefs show`), in order.
pub fn changes(dir: &Path) -> Vec<Change> {
    let o = super::run(
        Command::new("outagefs")
            .arg("show")
            .arg("--base")
            .arg(dir.join("base"))
            .arg("--changes")
            .arg(dir.join("changes")),
    );
    assert!(o.status.success(), "outagefs show: {}", super::text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut w = l.split_whitespace();
            assert_eq!(w.next(), Some(i.to_string().as_str()), "outagefs show: {l}");
            match w.next() {
                Some("Sync") => Change::Sync,
                Some("Write") => Change::Write,
                _ => panic!("outagefs show: unexpected line {l}"),
            }
        })
        .collect()
}

/// One power cut: the outagefs filter that makes it, and what it keeps in words.
#[derive(Clone, Debug)]
pub struct Cut {
    pub filter: String,
    pub what: String,
}

/// A cut after the Sync at `sync` (every change up to it kept): of the writes before
/// the next Sync, those `keep` says yes to are kept, the rest dropped.
pub fn cut_after_sync(changes: &[Change], sync: usize, mut keep: impl FnMut() -> bool) -> Cut {
    assert_eq!(changes[sync], Change::Sync);
    let window: String = changes[sync + 1..]
        .iter()
        .take_while(|c| **c == Change::Write)
        .map(|_| if keep() { '1' } else { '0' })
        .collect();
    let kept = window.chars().filter(|c| *c == '1').count();
    Cut {
        filter: format!("{}:{window}", sync + 1),
        what: format!(
            "all up to the Sync at change {sync}, then {kept} of the {} writes after it",
            window.len()
        ),
    }
}

/// A cut that keeps the first `n` changes, in order, and drops the rest.
pub fn cut_prefix(n: usize) -> Cut {
    Cut {
        filter: format!("{n}:"),
        what: format!("the first {n} changes, in order"),
    }
}
