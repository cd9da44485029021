//! The node's log file, rotated by size: `drove node run --log-file PATH` writes PATH
//! until the next line would take it past `max_size`, then renames PATH to PATH.1
//! (PATH.1 to PATH.2 and so on, dropping the oldest beyond `keep`) and starts a new
//! PATH. Disk use is bounded by about (keep + 1) x max_size, where a plain redirect
//! of stderr grew without end. Each tracing event reaches the file as one write, so
//! a rotation never splits a line.
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing_subscriber::fmt::MakeWriter;

/// A log file that rotates itself; clone it to share it between writers.
#[derive(Clone)]
pub struct LogFile(Arc<Mutex<Rotating>>);

struct Rotating {
    path: PathBuf,
    max_size: u64,
    keep: u32,
    file: File,
    /// Bytes in `file`.
    size: u64,
}

/// Open `path` for appending; a new file is the node's user's only (mode 0600): a
/// node's log names its VDIs, clients and peers.
fn open_append(path: &Path) -> io::Result<File> {
    drove_types::private_fs::options()
        .create(true)
        .append(true)
        .open(path)
}

/// `PATH.n`.
fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl LogFile {
    /// Open (append to) `path`, to be rotated past `max_size` bytes keeping `keep`
    /// old files.
    pub fn open(path: &Path, max_size: u64, keep: u32) -> io::Result<LogFile> {
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(LogFile(Arc::new(Mutex::new(Rotating {
            path: path.to_path_buf(),
            max_size: max_size.max(1),
            keep,
            file,
            size,
        }))))
    }

    /// Append one record (a whole line or more), rotating first if it would not
    /// fit. A record larger than `max_size` still goes out whole, into a file of
    /// its own.
    pub fn write_record(&self, buf: &[u8]) -> io::Result<()> {
        let mut r = self.0.lock();
        if r.size > 0 && r.size + buf.len() as u64 > r.max_size {
            // A failed rotation must not lose the line: keep writing to the
            // current file, and try again at the next line.
            let _ = r.rotate();
        }
        r.file.write_all(buf)?;
        r.size += buf.len() as u64;
        Ok(())
    }
}

impl Rotating {
    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            self.file = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&self.path)?;
            self.size = 0;
            return Ok(());
        }
        // Oldest first, so no rename overwrites a file still to be moved.
        match std::fs::remove_file(numbered(&self.path, self.keep)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        for n in (1..self.keep).rev() {
            match std::fs::rename(numbered(&self.path, n), numbered(&self.path, n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, numbered(&self.path, 1))?;
        // The old file stays open until the new one is, so a failure here leaves
        // the lines going to PATH.1 rather than nowhere.
        self.file = open_append(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

/// What the fmt layer writes one event through.
pub struct Writer(LogFile);

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_record(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogFile {
    type Writer = Writer;
    fn make_writer(&'a self) -> Writer {
        Writer(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn test_rotates_by_size_keeping_the_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.log");
        let log = LogFile::open(&path, 25, 2).unwrap();
        // Ten-byte lines: two fit in 25 bytes, the third starts a new file.
        for i in 0..9 {
            log.write_record(format!("line {i:04}\n").as_bytes())
                .unwrap();
        }
        assert_eq!(read(&path), "line 0008\n");
        assert_eq!(read(&numbered(&path, 1)), "line 0006\nline 0007\n");
        assert_eq!(read(&numbered(&path, 2)), "line 0004\nline 0005\n");
        assert!(!numbered(&path, 3).exists(), "keep is 2");
        let names = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(names, 3, "node.log, node.log.1, node.log.2 only");
        // Each one, the first and those the rotation made, is its user's only.
        use std::os::unix::fs::PermissionsExt;
        for p in [path.clone(), numbered(&path, 1), numbered(&path, 2)] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o600, "{} is {mode:o}", p.display());
        }
    }

    #[test]
    fn test_appends_to_an_existing_file_and_counts_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.log");
        std::fs::write(&path, "from before\n").unwrap();
        let log = LogFile::open(&path, 20, 1).unwrap();
        log.write_record(b"new\n").unwrap(); // 16 bytes: fits
        assert_eq!(read(&path), "from before\nnew\n");
        log.write_record(b"newer\n").unwrap(); // 22 > 20: rotates first
        assert_eq!(read(&path), "newer\n");
        assert_eq!(read(&numbered(&path, 1)), "from before\nnew\n");
    }

    #[test]
    fn test_a_record_larger_than_the_limit_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.log");
        let log = LogFile::open(&path, 8, 1).unwrap();
        log.write_record(b"0123456789abcdef\n").unwrap();
        assert_eq!(read(&path), "0123456789abcdef\n");
        log.write_record(b"x\n").unwrap();
        assert_eq!(read(&path), "x\n");
        assert_eq!(read(&numbered(&path, 1)), "0123456789abcdef\n");
    }

    #[test]
    fn test_keep_zero_truncates_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.log");
        let log = LogFile::open(&path, 10, 0).unwrap();
        log.write_record(b"aaaaaaa\n").unwrap();
        log.write_record(b"bbbbbbb\n").unwrap();
        assert_eq!(read(&path), "bbbbbbb\n");
        assert!(!numbered(&path, 1).exists());
    }

    #[test]
    fn test_the_fmt_layer_writes_whole_lines_through_it() {
        use tracing_subscriber::layer::SubscriberExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.log");
        let log = LogFile::open(&path, 200, 3).unwrap();
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(log)
            .with_ansi(false);
        let sub = tracing_subscriber::registry().with(fmt);
        tracing::subscriber::with_default(sub, || {
            for i in 0..40 {
                tracing::info!(i, "a line of the node's log");
            }
        });
        let mut all = Vec::new();
        for p in [
            numbered(&path, 3),
            numbered(&path, 2),
            numbered(&path, 1),
            path.clone(),
        ] {
            let text = read(&p);
            assert!(
                text.len() <= 200,
                "{} has {} bytes",
                p.display(),
                text.len()
            );
            assert!(text.ends_with('\n'), "{} ends mid-line", p.display());
            all.extend(text.lines().map(str::to_string));
        }
        // The newest lines, in order, none cut: the last file ends with i=39.
        let numbers: Vec<u32> = all
            .iter()
            .map(|l| {
                let v = l.rsplit("i=").next().unwrap_or("");
                v.trim().parse().unwrap_or_else(|_| panic!("cut line: {l}"))
            })
            .collect();
        assert_eq!(numbers.last(), Some(&39));
        assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    }
}
