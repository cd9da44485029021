//! The flush barrier of one NBD connection. Requests run concurrently, so a FLUSH can
//! be received while writes received before it are still in the export. NBD requires a
//! FLUSH to cover every write the client saw acknowledged before it sent the FLUSH; we
//! keep the simplest rule that implies it: a FLUSH first waits for every write-type
//! request (WRITE, WRITE_ZEROES, TRIM) *received* before it on this connection, then
//! calls the export's flush. Writes received after the FLUSH are not waited for, so a
//! flush never stalls behind a stream of later writes.
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::Notify;

/// Tracks the in-flight writes of one connection by arrival sequence number.
#[derive(Debug, Default)]
pub struct WriteTracker {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    in_flight: BTreeSet<u64>,
}

/// Held by a write while it runs; dropping it marks the write finished.
#[derive(Debug)]
pub struct WriteGuard {
    tracker: Arc<WriteTracker>,
    seq: u64,
}

/// The position of a FLUSH in the arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier(u64);

impl WriteTracker {
    /// A tracker with nothing in flight.
    pub fn new() -> Arc<Self> {
        Arc::new(WriteTracker::default())
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        // The state is a counter and a set; a panic elsewhere cannot leave it torn.
        self.state.lock()
    }

    /// Register a write at its arrival (call in arrival order, before spawning it).
    pub fn begin(self: &Arc<Self>) -> WriteGuard {
        let mut s = self.lock();
        let seq = s.next;
        s.next += 1;
        s.in_flight.insert(seq);
        WriteGuard {
            tracker: Arc::clone(self),
            seq,
        }
    }

    /// Mark a FLUSH's arrival: it will wait for the writes registered so far.
    pub fn barrier(&self) -> Barrier {
        Barrier(self.lock().next)
    }

    /// Wait until every write registered before `b` has finished.
    pub async fn wait(&self, b: Barrier) {
        loop {
            // Register interest before checking, so a write finishing between the
            // check and the await still wakes us.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let oldest = self.lock().in_flight.first().copied();
            match oldest {
                Some(seq) if seq < b.0 => notified.await,
                _ => return,
            }
        }
    }

    /// Writes currently in flight.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.tracker.lock().in_flight.remove(&self.seq);
        self.tracker.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn test_barrier_waits_for_earlier_writes_only() {
        let t = WriteTracker::new();
        let w1 = t.begin();
        let w2 = t.begin();
        let b = t.barrier();
        let later = t.begin();
        assert_eq!(t.in_flight(), 3);

        let t2 = Arc::clone(&t);
        let mut flush = tokio::spawn(async move { t2.wait(b).await });
        drop(w1);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut flush)
            .await
            .is_err());
        drop(w2);
        // `later` is still in flight: the barrier must not wait for it.
        tokio::time::timeout(Duration::from_secs(5), flush)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(t.in_flight(), 1);
        drop(later);
        assert_eq!(t.in_flight(), 0);
    }

    #[tokio::test]
    async fn test_barrier_with_nothing_in_flight_returns_at_once() {
        let t = WriteTracker::new();
        drop(t.begin());
        tokio::time::timeout(Duration::from_secs(1), t.wait(t.barrier()))
            .await
            .unwrap();
    }
}
