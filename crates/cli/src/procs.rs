//! The node processes of a local cluster (`drove up`, `drove down`): whether one
//! still runs, and stopping them all, politely first.
use drove_types::local_cluster::ClusterFile;
use std::time::{Duration, Instant};

/// Whether `pid` is a running process (a zombie, killed but not yet reaped by its
/// parent, does not count).
pub fn alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    if pid == 0 || unsafe { libc::kill(pid as i32, 0) } != 0 {
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
            // SAFETY: sending a signal to a pid we started has no memory effects.
            unsafe { libc::kill(n.pid as i32, libc::SIGTERM) };
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
            // SAFETY: as above.
            unsafe { libc::kill(n.pid as i32, libc::SIGKILL) };
        }
    }
    reap();
}

/// Collect exited children so that `alive` does not see zombies.
fn reap() {
    loop {
        // SAFETY: waitpid with WNOHANG on any child only reaps exited children.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if r <= 0 {
            break;
        }
    }
}
