//! What drove's test suites share (a dev-dependency of the crates whose tests use
//! it, never a dependency of the product):
//!
//! - prerequisites that are CI-aware: a test whose tool is missing ([`require`],
//!   [`require_ok`]) or that cannot run here ([`skip`]) prints
//!   "SKIPPED: <test>: <why>" and returns, except under CI ([`in_ci`]), where it
//!   fails: a CI pass never stands for a test that did not run;
//! - waits on a condition instead of sleeps ([`wait_until`] on a thread,
//!   [`wait_until_async`] on tokio);
//! - a process's resident memory ([`rss_bytes`]).
#![deny(missing_docs)]

use std::time::{Duration, Instant};

/// Whether the tests run under CI: `CI` is set to anything but "", "false" or "0"
/// (GitHub, GitLab and most others set CI=true).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "false" | "0"))
}

/// The running test's name (libtest names each test's thread after it).
pub fn test_name() -> String {
    match std::thread::current().name() {
        Some(n) if n != "main" => n.to_string(),
        _ => "this test".to_string(),
    }
}

/// Whether `tool` is an executable file in a directory of `PATH`.
pub fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(tool))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// A prerequisite of the running test is missing: under CI the test fails, since a
/// CI run that skipped its real-client tests would report a pass it never checked;
/// elsewhere it prints "SKIPPED: <test>: <why>" to stderr and the caller returns.
#[track_caller]
pub fn unmet(why: &str) {
    skipped(why, "install it (make deps) rather than skip the test");
}

/// Say the running test is skipped for `why`, or fail it under CI, where `fix`
/// says what to do instead.
#[track_caller]
fn skipped(why: &str, fix: &str) {
    let test = test_name();
    assert!(!in_ci(), "{test}: {why}, and CI is set: {fix}");
    eprintln!("SKIPPED: {test}: {why}");
}

/// Whether every tool in `tools` is on `PATH`; a test returns at once when it is
/// not. Under CI a missing tool fails the test instead (see [`unmet`]).
#[track_caller]
pub fn require(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    if missing.is_empty() {
        return true;
    }
    unmet(&format!("{} not installed", missing.join(", ")));
    false
}

/// [`require`] for a prerequisite found by a probe that says what is missing (a VM
/// kit: QEMU, a kernel and its modules): `Some` when found; under CI a missing one
/// fails the test.
#[track_caller]
pub fn require_ok<T>(found: Result<T, String>) -> Option<T> {
    match found {
        Ok(t) => Some(t),
        Err(why) => {
            unmet(&why);
            None
        }
    }
}

/// Skip the running test for a reason installing cannot fix (not running as root):
/// prints "SKIPPED: <test>: <why>" to stderr; under CI, which runs as root, the test
/// fails instead, so that a CI pass never stands for a test that did not run.
#[track_caller]
pub fn skip(why: &str) {
    skipped(why, "CI runs the suite as root so that this test runs");
}

/// Poll `cond` every 50 ms on this thread until it holds; panic after `timeout`,
/// naming `what`.
#[track_caller]
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Poll `check` every 100 ms on this thread until it returns `Ok`; panic after
/// `timeout`, naming `what` and showing what the last `Err` said (a test that
/// waits for a state on a busy machine then says which part was missing).
#[track_caller]
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let end = Instant::now() + timeout;
    loop {
        match check() {
            Ok(t) => return t,
            Err(last) => assert!(
                Instant::now() < end,
                "timed out after {timeout:?} waiting for {what}; last seen: {last}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Poll `cond` every 20 ms on tokio's clock until it holds; panic after `timeout`
/// (on that clock), naming `what`.
pub async fn wait_until_async(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + timeout;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The resident memory of process `pid` (this process: `None`) in bytes, from
/// `/proc/PID/status`; `None` when the process is gone (or a zombie).
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_this_process_has_a_resident_set_and_a_gone_one_has_none() {
        let me = rss_bytes(None).expect("this process runs");
        assert!(me > 1 << 20, "{me}");
        assert_eq!(rss_bytes(Some(u32::MAX)), None);
    }

    #[test]
    fn test_sh_is_on_path_and_a_made_up_tool_is_not() {
        assert!(on_path("sh"));
        assert!(!on_path("drove-no-such-tool"));
    }

    #[test]
    #[should_panic(expected = "timed out")]
    fn test_a_wait_for_what_never_holds_times_out() {
        wait_until(Duration::from_millis(120), "nothing", || false);
    }
}
