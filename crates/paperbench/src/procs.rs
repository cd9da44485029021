//! Child processes of the harness (toxiproxy, qemu-nbd, fio, the `drove` binary)
//! and the cancel flag that Ctrl-C sets. Every long-lived child is held by a
//! [`ProcGuard`] that kills and reaps it when dropped, so an error or an interrupt
//! anywhere still stops everything that was started. Waits poll the children and
//! the flag instead of blocking, so an interrupt is noticed within 50 ms.
use anyhow::{anyhow, bail, Context, Result};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set when the user asked to stop (Ctrl-C, SIGTERM).
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not yet set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the run to stop.
    pub fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the run was asked to stop.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// An error if the run was asked to stop.
    pub fn check(&self) -> Result<()> {
        if self.is_set() {
            bail!("Interrupted");
        }
        Ok(())
    }

    /// Sleep `d`, returning early with an error if the run is stopped.
    pub fn sleep(&self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    }
}

/// A child that is killed and reaped when the guard is dropped.
#[derive(Debug)]
pub struct ProcGuard {
    child: Option<Child>,
    what: String,
}

impl ProcGuard {
    /// Guard `child`, described by `what` in messages.
    pub fn new(child: Child, what: impl Into<String>) -> Self {
        ProcGuard {
            child: Some(child),
            what: what.into(),
        }
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// An error if the child has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(st) = c.try_wait()? {
                bail!("{} exited ({st})", self.what);
            }
        }
        Ok(())
    }

    /// Kill (SIGKILL) and reap the child now.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Already exited is fine: kill then fails and wait reaps it.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ProcGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wait for every child to exit, at most `timeout`. On timeout or cancel, every
/// child is killed. A child killed by SIGINT/SIGTERM means the user interrupted.
pub fn wait_all(
    children: &mut [ProcGuard],
    timeout: Duration,
    cancel: &Cancel,
) -> Result<Vec<ExitStatus>> {
    let end = Instant::now() + timeout;
    let mut done: Vec<Option<ExitStatus>> = vec![None; children.len()];
    loop {
        for (g, d) in children.iter_mut().zip(done.iter_mut()) {
            if d.is_none() {
                if let Some(c) = g.child.as_mut() {
                    *d = c
                        .try_wait()
                        .with_context(|| format!("Waiting for {}", g.what))?;
                }
            }
        }
        let interrupted = done
            .iter()
            .flatten()
            .any(|s| matches!(s.signal(), Some(sig) if sig == 2 || sig == 15));
        if cancel.is_set() || interrupted {
            children.iter_mut().for_each(ProcGuard::stop);
            bail!("Interrupted");
        }
        if done.iter().all(Option::is_some) {
            return Ok(done.into_iter().flatten().collect());
        }
        if Instant::now() > end {
            children.iter_mut().for_each(ProcGuard::stop);
            bail!(
                "Timed out after {} s waiting for clients",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run a short command to completion and return its stdout; an error with its
/// stderr when it fails.
pub fn run_checked(cmd: &mut Command, what: &str) -> Result<String> {
    let out: Output = cmd.output().with_context(|| format!("Cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("Cannot find a free port")?;
    Ok(l.local_addr()?.port())
}

/// Wait until something accepts TCP connections at `addr`, while `guard`'s child
/// keeps running.
pub fn wait_port(
    addr: &str,
    guard: &mut ProcGuard,
    timeout: Duration,
    cancel: &Cancel,
) -> Result<()> {
    let sa: std::net::SocketAddr = addr.parse().map_err(|_| anyhow!("Bad address {addr}"))?;
    let end = Instant::now() + timeout;
    loop {
        cancel.check()?;
        guard.check_running()?;
        if TcpStream::connect_timeout(&sa, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > end {
            bail!("Nothing listens on {addr} after {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `tool` can be found on PATH.
pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(tool);
            f.is_file()
                && std::fs::metadata(&f)
                    .map(|m| {
                        use std::os::unix::fs::PermissionsExt;
                        m.permissions().mode() & 0o111 != 0
                    })
                    .unwrap_or(false)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    fn sh(script: &str) -> ProcGuard {
        let c = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        ProcGuard::new(c, script)
    }

    #[test]
    fn test_wait_all_collects_statuses() {
        let mut v = vec![sh("exit 0"), sh("exit 3")];
        let st = wait_all(&mut v, Duration::from_secs(10), &Cancel::new()).unwrap();
        assert_eq!(
            st.iter().map(|s| s.code()).collect::<Vec<_>>(),
            vec![Some(0), Some(3)]
        );
    }

    #[test]
    fn test_wait_all_stops_on_cancel_and_timeout() {
        let cancel = Cancel::new();
        cancel.set();
        let mut v = vec![sh("exec sleep 30")];
        let t = Instant::now();
        let e = wait_all(&mut v, Duration::from_secs(60), &cancel).unwrap_err();
        assert!(e.to_string().contains("Interrupted"));
        assert!(t.elapsed() < Duration::from_secs(5));
        let mut v = vec![sh("exec sleep 30")];
        let e = wait_all(&mut v, Duration::from_millis(200), &Cancel::new()).unwrap_err();
        assert!(e.to_string().contains("Timed out"), "{e}");
    }

    #[test]
    fn test_guard_kills_on_drop() {
        let g = sh("exec sleep 30");
        let pid = g.id();
        drop(g);
        // Killed and reaped: /proc/PID is gone (no zombie left behind).
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        assert!(on_path("sh"));
        assert!(!on_path("surely-not-a-tool-xyz"));
    }
}
