//! The node processes of a local cluster (`drove up`, `drove down`): whether one
//! still runs, and stopping them all, politely first.
use drove_types::local_cluster::ClusterFile;
use rustix::process::{Pid, Signal};
use std::time::{Duration, Instant};

/// Whether `pid` is a running process (a zombie, killed but not yet reaped by its
/// parent, does not count).
pub fn alive(pid: u32) -> bool {
    let exists = to_pid(pid).is_some_and(|p| rustix::process::test_kill_process(p).is_ok());
    if !exists {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

/// SIGTERM every node, then SIGKILL what is left after 15 s.
pub async fn stop(f: &ClusterFile) {
    for n in &f.nodes {
        if alive(n.pid) {
            signal(n.pid, Signal::TERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while f.nodes.iter().any(|n| alive(n.pid)) && Instant::now() < deadline {
        reap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in &f.nodes {
        if alive(n.pid) {
            eprintln!("node {} did not stop in 15 s; killing it", n.id);
            signal(n.pid, Signal::KILL);
        }
    }
    reap();
}

/// Collect exited children so that `alive` does not see zombies.
fn reap() {
    // Ok(None): none has exited yet; an error: no child at all.
    while let Ok(Some(_)) = rustix::process::waitpid(None, rustix::process::WaitOptions::NOHANG) {}
}

/// `pid` as a process id; `None` for 0 and for numbers past `i32` (which `kill`
/// would take as a process group or every process).
fn to_pid(pid: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(pid).ok()?)
}

/// Send `sig` to process `pid` (nothing for a pid that cannot be one).
fn signal(pid: u32, sig: Signal) {
    if let Some(p) = to_pid(pid) {
        let _ = rustix::process::kill_process(p, sig);
    }
}
