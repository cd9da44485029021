//! The writes a datacenter-loss run keeps going while a zone is lost: each VM
//! outside the lost zone writes 4 KiB blocks of its VDI through its node's gateway,
//! one at a time, as a guest does. What is measured is the longest pause: the
//! longest time, ending after the loss, between two acknowledgements of one VM's
//! writes (or between its last one and the end). A write to an object with a copy
//! in the lost zone waits for the silent copy until the gateway gives it up and
//! the copy is marked down; with openraft, when the leader was in the lost zone,
//! that mark-down waits for a new leader too.
use bytes::Bytes;
use drove_types::ObjectId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cluster::{SimCluster, Vm};

/// A block each write covers.
const BLOCK: u64 = 4096;
/// A VM's think time between one write's end and its next.
const THINK: Duration = Duration::from_millis(50);
/// A write that has not ended by then counts as failed.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// The wait after a failed write before the next.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// What one VM's writes measured.
#[derive(Debug, Default, Clone, Copy)]
struct Pause {
    longest: Duration,
    acked: u64,
    failed: u64,
}

/// The running writers.
pub(crate) struct Writers {
    stop: Arc<Mutex<Option<Instant>>>,
    tasks: Vec<JoinHandle<Pause>>,
}

/// What the writers measured.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Measured {
    /// The longest pause of any VM, ending after the loss.
    pub longest: Duration,
    /// Writes acknowledged.
    pub acked: u64,
    /// Writes that failed or did not end within [`OP_TIMEOUT`].
    pub failed: u64,
}

impl Writers {
    /// Start a writer for each of `vms` (VDIs of `size` bytes); pauses count when
    /// they end at `from` or later.
    pub(crate) fn start(c: &Arc<SimCluster>, vms: &[Vm], size: u64, from: Instant) -> Writers {
        let stop = Arc::new(Mutex::new(None));
        let tasks = vms
            .iter()
            .map(|vm| tokio::spawn(write_on(c.clone(), vm.clone(), size, from, stop.clone())))
            .collect();
        Writers { stop, tasks }
    }

    /// Stop them (now); what they measured.
    pub(crate) async fn stop(self) -> Measured {
        *self.stop.lock() = Some(Instant::now());
        let mut m = Measured::default();
        for t in self.tasks {
            if let Ok(p) = t.await {
                m.longest = m.longest.max(p.longest);
                m.acked += p.acked;
                m.failed += p.failed;
            }
        }
        m
    }
}

/// One VM's writes until `stop` is set.
async fn write_on(
    c: Arc<SimCluster>,
    vm: Vm,
    size: u64,
    from: Instant,
    stop: Arc<Mutex<Option<Instant>>>,
) -> Pause {
    let mut p = Pause::default();
    let Some(vdi) = c.vdi(&vm.name) else {
        return p;
    };
    let object_size = u64::from(vdi.object_size);
    let blocks = (size / BLOCK).max(1);
    let data = Bytes::from(vec![0x5au8; BLOCK as usize]);
    let mut last = Instant::now();
    let mut i = 0u64;
    let gap = |last: Instant, now: Instant| {
        if now >= from {
            now.duration_since(last)
        } else {
            Duration::ZERO
        }
    };
    loop {
        if let Some(at) = *stop.lock() {
            p.longest = p.longest.max(gap(last, at));
            return p;
        }
        let Some(node) = c.node(vm.node) else {
            return p;
        };
        // Blocks spread over the VDI's objects, a prime step apart.
        let off = (i * 7919 % blocks) * BLOCK;
        i += 1;
        let oid = ObjectId::new(vdi.id, (off / object_size) as u32);
        let write = node.gateway.write(
            &vdi,
            oid,
            off % object_size,
            data.clone(),
            false,
            vm.generation,
        );
        match tokio::time::timeout(OP_TIMEOUT, write).await {
            Ok(Ok(())) => {
                let now = Instant::now();
                // An acknowledgement after the stop still ends the pause at the stop.
                let end = stop.lock().map_or(now, |at| at.min(now));
                if gap(last, end) > Duration::from_secs(1) {
                    tracing::info!(vm = %vm.name, node = %vm.node, %oid, pause_ms = gap(last, end).as_millis() as u64, "dc-loss: a write ended a pause");
                }
                p.longest = p.longest.max(gap(last, end));
                last = now;
                p.acked += 1;
                tokio::time::sleep(THINK).await;
            }
            res => {
                tracing::info!(vm = %vm.name, %oid, "dc-loss: a write failed: {res:?}");
                p.failed += 1;
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}
