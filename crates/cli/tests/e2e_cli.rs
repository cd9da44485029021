//! The `drove` command as a shell uses it: output into a pipe the reader closed
//! early.
mod common;
use common::*;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

/// The write end of a pipe whose read end is already closed, as after
/// `drove … | head -1` once head has exited: every write to it fails (EPIPE).
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe() writes two new descriptors into the array it is given.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe()");
    // SAFETY: fds[0] was just made and is closed once, here.
    unsafe { libc::close(fds[0]) };
    // SAFETY: fds[1] was just made and nothing else owns it.
    Stdio::from(unsafe { OwnedFd::from_raw_fd(fds[1]) })
}

/// Whether process `pid` ignores SIGPIPE (the SigIgn mask of /proc/PID/status).
fn ignores_sigpipe(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .expect("SigIgn line");
    let mask = u64::from_str_radix(mask.trim(), 16).unwrap();
    mask & (1 << (libc::SIGPIPE - 1)) != 0
}

#[test]
fn test_printing_into_a_closed_pipe_does_not_panic() {
    let c = Cluster::start(1, 1);
    c.create_vdi("v", "1M", &["--copies", "1"]);
    let admin = &c.nodes[0].admin;
    for args in [
        &["cluster", "status"][..],
        &["cluster", "status", "--json"],
        &["node", "list"],
        &["vdi", "list"],
        &["vdi", "info", "v"],
    ] {
        let o = Command::new(drove_bin())
            .args(args)
            .args(["--cluster", admin])
            .stdout(closed_pipe())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "drove {args:?} into a closed pipe: {err}"
        );
        assert_ne!(o.status.code(), Some(101), "drove {args:?}: {err}");
        // Ended by SIGPIPE like any Unix filter (or done before its first write).
        assert!(
            o.status.signal() == Some(libc::SIGPIPE) || o.status.success(),
            "drove {args:?} ended with {:?}: {err}",
            o.status
        );
    }
    // The daemon still ignores SIGPIPE: a peer closing a socket must never kill it.
    assert!(
        ignores_sigpipe(c.nodes[0].pid),
        "node run must ignore SIGPIPE"
    );
}
