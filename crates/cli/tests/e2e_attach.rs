//! Attach under contention: qemu-io processes attach VDIs through one node, write
//! 4 KiB and detach, two writers per VDI racing each other's lock release and a
//! reader beside them. A writer that finds the lock still held by the previous one
//! waits for its release; a reader is never refused. (The same load, with figures:
//! `bench/attach.py`.)
mod common;
use common::*;
use parking_lot::Mutex;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

const VDIS: usize = 32;
const WRITE_CYCLES: usize = 1000;

/// One qemu-io process: attach, one command, detach. The error text if it failed.
fn cycle(uri: &str, write: Option<usize>) -> Option<String> {
    let mut cmd = Command::new("qemu-io");
    match write {
        Some(p) => cmd.args(["-f", "raw", "-c", &format!("write -P {p} {} 4k", p * 4096)]),
        None => cmd.args(["-r", "-f", "raw", "-c", "read 0 4k"]),
    };
    let o = run(cmd.arg(uri));
    let t = text(&o);
    let lower = t.to_lowercase();
    (!o.status.success() || lower.contains("failed") || lower.contains("error")).then_some(t)
}

#[test]
fn test_a_thousand_attach_write_detach_cycles_over_32_vdis_do_not_fail() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    for v in 0..VDIS {
        c.create_vdi(&format!("a{v}"), "64M", &[]);
    }
    let left = AtomicUsize::new(WRITE_CYCLES);
    let done = (AtomicUsize::new(0), AtomicUsize::new(0));
    let failures = Mutex::new(Vec::new());
    // The patterns that were written at least once, per VDI.
    let written = Mutex::new(std::collections::BTreeSet::new());
    std::thread::scope(|s| {
        for v in 0..VDIS {
            let uri = c.nodes[0].uri(&format!("a{v}"));
            for role in [Some(1), Some(2), None] {
                let (uri, left, done, failures, written) =
                    (uri.clone(), &left, &done, &failures, &written);
                s.spawn(move || loop {
                    let more = match role {
                        Some(_) => left
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok(),
                        None => left.load(Ordering::SeqCst) > 0,
                    };
                    if !more {
                        return;
                    }
                    let counter = if role.is_some() { &done.0 } else { &done.1 };
                    counter.fetch_add(1, Ordering::SeqCst);
                    match (cycle(&uri, role), role) {
                        (Some(e), _) => {
                            let kind = if role.is_some() { "write" } else { "read" };
                            failures.lock().push(format!("{kind} a{v}: {e}"));
                        }
                        (None, Some(p)) => {
                            written.lock().insert((v, p));
                        }
                        (None, None) => {}
                    }
                });
            }
        }
    });
    let failures = failures.into_inner();
    let (writes, reads) = (done.0.into_inner(), done.1.into_inner());
    eprintln!(
        "{writes} write cycles, {reads} read cycles, {} failed",
        failures.len()
    );
    assert_eq!(writes, WRITE_CYCLES);
    assert!(
        failures.is_empty(),
        "{} of {} cycles failed; the first: {:#?}",
        failures.len(),
        writes + reads,
        &failures[..failures.len().min(5)]
    );
    // Each writer's block holds its pattern (each writes its own block).
    for (v, p) in written.into_inner() {
        let uri = c.nodes[0].uri(&format!("a{v}"));
        let read = format!("read -P {p} {} 4k", p * 4096);
        let t = text(&run(
            Command::new("qemu-io").args(["-r", "-f", "raw", "-c", &read, &uri])
        ));
        assert!(!t.to_lowercase().contains("fail"), "a{v} pattern {p}: {t}");
    }
}
