//! The zone-sync shipper's queues: for each VDI, the writes its home-zone copies
//! acknowledged and the copies in other zones do not have yet (the *lag*).
//!
//! - Order. Writes are shipped in the order they were acknowledged wherever order
//!   matters: an entry starts only when no earlier entry of the same object that
//!   touches the same 4 KiB blocks ([`block_span`]) is queued or in flight. Entries
//!   that do not overlap go in parallel
//!   (up to [`MAX_FLYING`] entries and [`State::flying_budget`] bytes), and a write that continues the previous queued write of
//!   its object is merged into it (up to [`MERGE_MAX`]), so a sequential stream
//!   crosses the WAN in large requests rather than one round trip per 4 KiB.
//! - Rewrites. A write that covers a queued (not yet shipped) write of its object
//!   takes that entry's place, when no entry queued after it touches the bytes it
//!   writes ([`State::superseded`]): the far copies get the newer bytes once
//!   instead of both in turn. A block ships one entry per round trip.
//! - The unit of order is the 4 KiB block, not the gateway's 64 KiB chunk
//!   ([`crate::ranges`]): the gateway holds a chunk until every home copy answered,
//!   so that no two replicas see two writes of one chunk in different orders; the
//!   lane only needs writes of the same bytes in order (a block's checksum is
//!   rewritten whole, so the block is the unit). With chunks, a chunk shipped one
//!   entry per round trip and 4 KiB writes over a 16 MiB disk (256 chunks) were
//!   held to 256 writes per 20 ms round trip: `drove sim paper --policy zone-sync
//!   --ops small-write --parallel 1 --time 60s`, 103.2 MB/s per client without the
//!   delay, 62.8 with it.
//! - Bound. A writer is admitted while the lag stays within the VDI's bound: bytes
//!   queued or in flight at most `max_lag_bytes`, and in time, the oldest entry
//!   younger than half of `max_lag` *and* the bytes waiting shippable in half of
//!   `max_lag` at the rate the lane has been shipping. Half, so that what is admitted
//!   at the edge still arrives within the bound; and the oldest entry's age plus the
//!   time to ship everything waiting within [`ADMIT_SHARE`] of `max_lag`, a margin for
//!   a rate measured a little high. The rate is measured afresh in every busy
//!   spell of the lane (the link may have changed while it was idle); until it is,
//!   the lane takes [`FIRST_ALLOWANCE`] (or two writes), and only what the last
//!   spell's rate would have admitted too, unless this spell already shipped faster
//!   than that rate. A slower sample replaces the rate at once. A writer at the
//!   bound waits (it is slowed, never dropped).
//! - Nothing here talks to the network: the gateway's lane worker takes batches with
//!   [`Lane::take`], ships them and reports with [`Lane::finish`].
use bytes::{Bytes, BytesMut};
use drove_proto::PeerReq;
use drove_types::{Epoch, NodeId, ObjVersion, ObjectId, Result, VdiInfo, BLOCK_SIZE};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// Entries of one lane in flight at once: as many 4 KiB writes as
/// [`MAX_FLYING_BYTES`] holds, so that small random writes are held by the byte
/// budget, not by their count. With 128, a lane shipped at most 128 writes per
/// round trip: 26 MB/s of 4 KiB writes at 10 ms one way, and a zone-sync writer of
/// 40 MB/s was held to 25.5 MB/s once its lag filled (LatencyImpactRatio 0.63,
/// bench/results/paper-full-2026-11-24e.md).
pub(crate) const MAX_FLYING: usize = (MAX_FLYING_BYTES / 4096) as usize;
/// Bytes of one lane in flight at once: enough for a fast WAN (8 MiB per 10 ms round
/// trip is 800 MB/s), and little enough that a shipped write never waits long behind
/// the lane's others in a peer connection (a slow link otherwise queues them past
/// the request timeout and the pool's silence watchdog, and they are sent again).
pub(crate) const MAX_FLYING_BYTES: u64 = 8 << 20;
/// A lane that has measured its rate keeps what it ships in this long in flight,
/// between [`MAX_FLYING_BYTES`] and [`MAX_FLYING_BYTES_FAST`]: a write then waits at most
/// about this long behind the lane's others, and a fast link is not held to 8 MiB
/// per round trip (a 1 MiB writer at 10 ms one-way shipped about 315 MB/s against 373
/// MB/s without the delay, and was held to that once its lag filled).
const FLYING_TIME: Duration = Duration::from_millis(250);
/// The most bytes a lane keeps in flight, however fast it ships.
pub(crate) const MAX_FLYING_BYTES_FAST: u64 = 64 << 20;
/// The largest merged write: 1 MiB.
pub(crate) const MERGE_MAX: usize = 1 << 20;
/// Bytes a lane admits before it has measured how fast it ships. Small: shipping it
/// must fit in half the lag bound on any link zone-sync is used over (at 1 MiB, a
/// 512 KB/s link took 2 s for the first allowance alone and a lag reached 3.8 s
/// against a 2 s bound in e2e_zonesync's home-zone-loss test).
pub(crate) const FIRST_ALLOWANCE: u64 = 256 << 10;
/// The share of a VDI's time bound a write admitted now is expected to arrive
/// within, by the lane's measured rate: the rest is the margin for a rate measured a
/// little above what the link gives.
const ADMIT_SHARE: f64 = 0.8;
/// Entries of a queue looked at for one batch (the queue may hold many thousand).
const SCAN: usize = 1024;
/// A lane's shipping rate is sampled over windows at least this long.
const RATE_WINDOW: Duration = Duration::from_millis(200);
/// What an entry costs the lag besides its payload (a zeroing has none).
const ENTRY_OVERHEAD: u64 = 64;

/// A write as the copies outside the home zone receive it.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// Bytes at an offset.
    Write {
        /// Offset in the object.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Zeros over a range.
    Zeroes {
        /// Offset in the object.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// The whole object replaced (a clone's copy-up).
    Create {
        /// Its new content.
        data: Bytes,
    },
}

impl Op {
    /// The byte range of the object it changes.
    fn range(&self) -> (u64, u64) {
        match self {
            Op::Write { offset, data } => (*offset, data.len() as u64),
            Op::Zeroes { offset, len } => (*offset, *len),
            Op::Create { .. } => (0, u64::MAX / 2),
        }
    }

    /// Its payload.
    pub(crate) fn payload(&self) -> Bytes {
        match self {
            Op::Write { data, .. } | Op::Create { data } => data.clone(),
            Op::Zeroes { .. } => Bytes::new(),
        }
    }

    /// What it weighs in the lag.
    fn weight(&self) -> u64 {
        self.payload().len() as u64 + ENTRY_OVERHEAD
    }

    /// The peer request for it, under lock `generation`, on a map of `epoch`, for
    /// a write acknowledged under the map of `made` (see [`PeerReq::Write`]).
    pub(crate) fn request(
        &self,
        oid: ObjectId,
        fua: bool,
        generation: u64,
        epoch: Epoch,
        made: Epoch,
        forward: Vec<NodeId>,
    ) -> PeerReq {
        match self {
            Op::Write { offset, .. } => PeerReq::Write {
                oid,
                offset: *offset,
                fua,
                epoch,
                generation,
                forward,
                made,
            },
            Op::Zeroes { offset, len } => PeerReq::WriteZeroes {
                oid,
                offset: *offset,
                len: *len,
                fua,
                epoch,
                generation,
                forward,
                made,
            },
            Op::Create { .. } => PeerReq::Create {
                oid,
                epoch,
                generation,
                forward,
                made,
            },
        }
    }
}

/// One write waiting for (or on its way to) the copies outside the home zone.
pub(crate) struct Entry {
    /// The object.
    pub oid: ObjectId,
    /// The VDI record it was written under (its placement decides the copies).
    pub vdi: Arc<VdiInfo>,
    /// The write.
    pub op: Op,
    /// The lock generation it was written under.
    pub generation: u64,
    /// The epoch of the map the home-zone copies took it on: the far copies record
    /// it as their version, so that one shipped after the map moved on does not
    /// claim a later version than the home copies' (it would then be recovered
    /// from over them, short of the writes not shipped yet: `drove sim faults
    /// --seed 192 --time 40s`).
    pub made: Epoch,
    /// How many home-zone copies acknowledged it (they count towards `min_copies`
    /// when a copy elsewhere fails).
    pub near_applied: usize,
    seq: u64,
    at: Instant,
    weight: u64,
    done: Vec<oneshot::Sender<Result<()>>>,
}

impl Entry {
    /// Tell whoever waits for this entry how its shipping ended.
    pub(crate) fn complete(&mut self, res: &Result<()>) {
        for tx in self.done.drain(..) {
            let r = match res {
                Ok(()) => Ok(()),
                Err(e) => Err(crate::gateway::again(e)),
            };
            let _ = tx.send(r);
        }
    }
}

/// The lag of one VDI.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lag {
    /// Bytes acknowledged and not yet on every copy outside the home zone.
    pub bytes: u64,
    /// Writes (entries) not yet shipped.
    pub writes: u64,
    /// Age of the oldest of them, in seconds (0 when none).
    pub seconds: f64,
}

/// An entry in flight, as the lane keeps it: its sequence number, object, block
/// span and when it was queued.
struct Flying {
    seq: u64,
    oid: ObjectId,
    span: (u64, u64),
    at: Instant,
    weight: u64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Entry>,
    flying: Vec<Flying>,
    bytes: u64,
    next_seq: u64,
    /// A worker is running for this lane.
    running: bool,
    /// Objects shipped since the last flush of the far copies.
    shipped: BTreeSet<ObjectId>,
    /// Entries queued or in flight, per object.
    per_object: HashMap<ObjectId, usize>,
    /// Shipping rate, bytes per second (smoothed), once measured in this busy
    /// spell.
    rate: Option<f64>,
    /// The rate of an earlier spell, until this one's first sample: a write it
    /// would not admit waits (see [`State::admits`]). Dropped when this spell
    /// ships faster than it says.
    prior: Option<f64>,
    window: Option<(Instant, u64)>,
    /// Writes given up (a final error: fenced, deleted...) since the lane began:
    /// how many, and the first one's sequence number and error. A sync that waited
    /// for any of them fails with it; the copies outside the home zone lack them.
    given_up: Option<(u64, u64, String)>,
}

/// The queue of one VDI.
#[derive(Default)]
pub(crate) struct Lane {
    st: Mutex<State>,
    moved: Notify,
}

/// Whether an entry with block span `span` of `oid` conflicts with any of `held`.
fn overlaps(held: &[(ObjectId, (u64, u64))], oid: ObjectId, span: (u64, u64)) -> bool {
    held.iter()
        .any(|&(o, (a, b))| o == oid && a <= span.1 && span.0 <= b)
}

/// The first and last 4 KiB block `[offset, offset+len)` touches (one block when
/// empty): the lane's unit of order.
pub(crate) fn block_span(offset: u64, len: u64) -> (u64, u64) {
    (
        offset / BLOCK_SIZE,
        offset.saturating_add(len.max(1) - 1) / BLOCK_SIZE,
    )
}

fn span_of(op: &Op) -> (u64, u64) {
    let (offset, len) = op.range();
    block_span(offset, len)
}

impl State {
    /// When the oldest entry queued or in flight was queued. The queue is in the
    /// order entries were pushed (under the lock, with the time of the push), so
    /// its front is its oldest; every admission asks, and the queue may be long.
    fn oldest(&self) -> Option<Instant> {
        let q = self.queue.front().map(|e| e.at);
        let f = self.flying.iter().map(|f| f.at).min();
        q.into_iter().chain(f).min()
    }

    fn lag(&self, now: Instant) -> Lag {
        Lag {
            bytes: self.bytes,
            writes: (self.queue.len() + self.flying.len()) as u64,
            seconds: self
                .oldest()
                .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64()),
        }
    }

    /// Whether a write of `weight` may join the lag now.
    fn admits(&self, weight: u64, bound: (Duration, u64), now: Instant) -> bool {
        if self.queue.is_empty() && self.flying.is_empty() {
            return true;
        }
        let (time, bytes) = bound;
        let half = time.as_secs_f64() / 2.0;
        if self.bytes + weight > bytes {
            return false;
        }
        if self
            .oldest()
            .is_some_and(|t| now.saturating_duration_since(t).as_secs_f64() >= half)
        {
            return false;
        }
        match self.rate {
            // The oldest write arrives at the latest once everything queued before
            // it and the new write are shipped: its age now plus that time must
            // stay within [`ADMIT_SHARE`] of the bound, the rest being room for a
            // rate measured a little high (a 1 MiB writer over a 2 MB/s link
            // reached 2.008 s against a 2 s bound with the two halves alone).
            Some(r) => self.within(r, weight, bound, now),
            // Two writes larger than the allowance may fly at once: with only one,
            // the lane empties between them, every write starts a new busy spell, no
            // rate is ever measured, and a 1 MiB writer ships one write per WAN
            // round trip (zone-sync block writes fell to 0.12 of their no-delay
            // speed in bench/results/paper-full-2026-11-23).
            // The last spell's rate must admit the write too: with the first
            // allowance alone, a writer whose lane emptied between its writes (a
            // busy machine) had two 1 MiB writes in blind at every spell, and its
            // lag reached 2.01 s against a 2 s bound in e2e_zonesync. Alone, the
            // last rate would be no better: a link that slowed while the lane was
            // idle let 4 MiB in against a 2 s bound over a 2 MB/s link, 2.04 s.
            None => {
                self.bytes + weight <= FIRST_ALLOWANCE.max(2 * weight)
                    && self
                        .prior
                        .is_none_or(|r| self.within(r, weight, bound, now))
            }
        }
    }

    /// Whether, at shipping rate `r`, the bytes waiting and a new write of
    /// `weight` ship within half the time bound, and the oldest entry's age plus
    /// that time within [`ADMIT_SHARE`] of it.
    fn within(&self, r: f64, weight: u64, bound: (Duration, u64), now: Instant) -> bool {
        let time = bound.0.as_secs_f64();
        let ship = (self.bytes + weight) as f64 / r;
        let age = self
            .oldest()
            .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
        ship <= time / 2.0 && age + ship <= ADMIT_SHARE * time
    }

    /// The queued entry a write of `op` to `oid` under lock `generation` may take
    /// the place of: the last queued entry of the object whose bytes it touches, if
    /// it writes all of them (and under the same lock). Entries queued after that
    /// one touch none of its bytes, so the write may go where that one is: disjoint
    /// writes land the same in either order, and every earlier write of those bytes
    /// still goes first. The entry keeps its place, sequence number and age, so a
    /// mark set after it is not passed until the newer bytes are shipped, and the
    /// lag counts from the older write. Only the last [`SCAN`] entries are looked
    /// at; an entry in flight is never replaced.
    fn superseded(&self, oid: ObjectId, op: &Op, generation: u64) -> Option<usize> {
        if !self.per_object.contains_key(&oid) {
            return None;
        }
        let (start, len) = op.range();
        let end = start.saturating_add(len);
        let (j, e) = self
            .queue
            .iter()
            .enumerate()
            .rev()
            .take(SCAN)
            .find(|(_, e)| {
                let (s, l) = e.op.range();
                e.oid == oid && s < end && start < s.saturating_add(l)
            })?;
        let (s, l) = e.op.range();
        (start <= s && s.saturating_add(l) <= end && e.generation == generation).then_some(j)
    }

    /// Bytes this lane may have in flight: [`MAX_FLYING_BYTES`] until its rate is
    /// known, then what it ships in [`FLYING_TIME`], up to [`MAX_FLYING_BYTES_FAST`].
    /// The rate measured is what the budget let through: on a link whose round trip
    /// is shorter than `FLYING_TIME` the budget grows towards the cap, on a slower
    /// one it stays at the floor.
    pub(crate) fn flying_budget(&self) -> u64 {
        match self.rate {
            Some(r) => ((r * FLYING_TIME.as_secs_f64()) as u64)
                .clamp(MAX_FLYING_BYTES, MAX_FLYING_BYTES_FAST),
            None => MAX_FLYING_BYTES,
        }
    }

    /// `n` entries of `oid` left the lag (or were merged into another).
    fn forget(&mut self, oid: ObjectId, n: usize) {
        if let Some(c) = self.per_object.get_mut(&oid) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.per_object.remove(&oid);
            }
        }
    }

    /// Count `shipped` bytes done at `now` into the rate: a window opens when a busy
    /// spell starts (nothing shipped before it) or at a completion (whose bytes were
    /// shipped before it, so they are not counted) and closes at the first
    /// completion `RATE_WINDOW` later. The first sample thus comes with the first
    /// completion that late, however long one shipment takes on a slow link. A slower sample replaces
    /// the rate at once (a link that slows down must stop admissions now); a faster
    /// one raises it gradually.
    fn sample_rate(&mut self, shipped: u64, now: Instant) {
        let Some((start, sum)) = &mut self.window else {
            self.window = Some((now, 0));
            return;
        };
        *sum += shipped;
        let elapsed = now.saturating_duration_since(*start);
        if elapsed >= RATE_WINDOW {
            let sample = *sum as f64 / elapsed.as_secs_f64();
            self.rate = Some(match self.rate {
                Some(r) if sample >= r => 0.7 * r + 0.3 * sample,
                _ => sample,
            });
            self.prior = None;
            self.window = Some((now, 0));
        } else if self.rate.is_none()
            && self
                .prior
                .is_some_and(|p| *sum as f64 > p * elapsed.as_secs_f64())
        {
            // Shipped faster than the prior rate says, round trips included: the
            // link is faster now. Keeping it, a lane whose writes each ship within
            // the window would never take a sample and stay held to it.
            self.prior = None;
        }
    }
}

impl Lane {
    /// The lag now.
    pub(crate) fn lag(&self) -> Lag {
        self.st.lock().lag(Instant::now())
    }

    /// Whether a write of `oid` is queued or in flight: the copies outside the home
    /// zone may not have it yet.
    pub(crate) fn pending_for(&self, oid: ObjectId) -> bool {
        self.st.lock().per_object.contains_key(&oid)
    }

    /// Whether anything is queued or in flight.
    pub(crate) fn pending(&self) -> bool {
        let st = self.st.lock();
        !st.queue.is_empty() || !st.flying.is_empty()
    }

    /// The sequence number the next entry gets: everything below it was queued
    /// before now.
    pub(crate) fn mark(&self) -> u64 {
        self.st.lock().next_seq
    }

    /// Whether every entry queued before `mark` was shipped (or given up).
    pub(crate) fn passed(&self, mark: u64) -> bool {
        let st = self.st.lock();
        st.queue.iter().all(|e| e.seq >= mark) && st.flying.iter().all(|f| f.seq >= mark)
    }

    /// The writes queued before `mark` that were given up: how many were given up
    /// in all and the first one's error (none when the first came after `mark`).
    pub(crate) fn given_up_before(&self, mark: u64) -> Option<(u64, String)> {
        let st = self.st.lock();
        st.given_up
            .as_ref()
            .filter(|(_, seq, _)| *seq < mark)
            .map(|(n, _, err)| (*n, err.clone()))
    }

    /// Wait until something moves in this lane (an entry done), or `at_most`.
    pub(crate) async fn moved(&self, at_most: Duration) {
        let _ = tokio::time::timeout(at_most, self.moved.notified()).await;
    }

    /// Queue a write, waiting while the lag is at the VDI's bound unless `wait_done`
    /// (the writer waits for the shipping itself, so it adds nothing to the lag that
    /// is not waited for). Returns the entry's completion when `wait_done`, and
    /// whether a worker must be started for the lane.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn push(
        &self,
        vdi: Arc<VdiInfo>,
        oid: ObjectId,
        op: Op,
        written: ObjVersion,
        near_applied: usize,
        wait_done: bool,
        on_wait: impl Fn(),
    ) -> (Option<oneshot::Receiver<Result<()>>>, bool) {
        let weight = op.weight();
        let bound = vdi.max_lag();
        let mut waited = false;
        loop {
            let moved = self.moved.notified();
            {
                let mut st = self.st.lock();
                let now = Instant::now();
                if wait_done || st.admits(weight, bound, now) {
                    let (rx, done) = if wait_done {
                        let (tx, rx) = oneshot::channel();
                        (Some(rx), vec![tx])
                    } else {
                        (None, Vec::new())
                    };
                    let start = !st.running;
                    st.running = true;
                    if let Some(j) = st.superseded(oid, &op, written.generation) {
                        let e = &mut st.queue[j];
                        let old = std::mem::replace(&mut e.weight, weight);
                        e.op = op;
                        e.vdi = vdi;
                        e.made = Epoch(written.epoch);
                        e.near_applied = near_applied;
                        e.done.extend(done);
                        st.bytes = st.bytes - old + weight;
                        return (rx, start);
                    }
                    let seq = st.next_seq;
                    st.next_seq += 1;
                    if st.queue.is_empty() && st.flying.is_empty() {
                        // A new busy spell: the link may not be what it was, so
                        // its rate is measured afresh from now, the first
                        // allowance holding until then; the last spell's rate
                        // holds too, as `prior`.
                        st.window = Some((now, 0));
                        st.prior = st.rate.take().or(st.prior);
                    }
                    st.bytes += weight;
                    *st.per_object.entry(oid).or_default() += 1;
                    st.queue.push_back(Entry {
                        oid,
                        vdi,
                        op,
                        generation: written.generation,
                        made: Epoch(written.epoch),
                        near_applied,
                        seq,
                        at: now,
                        weight,
                        done,
                    });
                    return (rx, start);
                }
            }
            if !waited {
                waited = true;
                on_wait();
            }
            // Time alone can open the bound (the oldest entry shipped, a rate
            // measured): look again at least every 20 ms.
            let _ = tokio::time::timeout(Duration::from_millis(20), moved).await;
        }
    }

    /// The next entries to ship, at most `room`: each is the first queued write of
    /// its blocks, with the writes that directly continue it merged in. `None` when
    /// nothing is queued or in flight: the worker stops (and the lane is marked
    /// idle, so the next push starts one).
    pub(crate) fn take(&self, room: usize) -> Option<Vec<Entry>> {
        let mut guard = self.st.lock();
        let st = &mut *guard;
        if st.queue.is_empty() && st.flying.is_empty() {
            st.running = false;
            return None;
        }
        let mut held: Vec<(ObjectId, (u64, u64))> =
            st.flying.iter().map(|f| (f.oid, f.span)).collect();
        let mut out = Vec::new();
        let mut i = 0;
        let mut looked = 0;
        let mut flying_bytes: u64 = st.flying.iter().map(|f| f.weight).sum();
        let budget = st.flying_budget();
        while i < st.queue.len()
            && out.len() < room
            && looked < SCAN
            && (flying_bytes < budget || st.flying.is_empty())
        {
            looked += 1;
            let e = &st.queue[i];
            let span = span_of(&e.op);
            if overlaps(&held, e.oid, span) {
                // Later entries of these blocks wait behind it.
                held.push((e.oid, span));
                i += 1;
                continue;
            }
            let mut e = st.queue.remove(i).expect("index in range");
            let merged = merge_following(&mut st.queue, i, &mut e, &held);
            if merged > 0 {
                st.forget(e.oid, merged);
            }
            let span = span_of(&e.op);
            held.push((e.oid, span));
            flying_bytes += e.weight;
            st.flying.push(Flying {
                seq: e.seq,
                oid: e.oid,
                span,
                at: e.at,
                weight: e.weight,
            });
            out.push(e);
        }
        Some(out)
    }

    /// Entry `e` left the lag (shipped, or given up with `res`).
    pub(crate) fn finish(&self, mut e: Entry, res: &Result<()>) {
        {
            let mut st = self.st.lock();
            st.flying.retain(|f| f.seq != e.seq);
            st.forget(e.oid, 1);
            st.bytes = st.bytes.saturating_sub(e.weight);
            match res {
                Ok(()) => {
                    st.shipped.insert(e.oid);
                    st.sample_rate(e.weight, Instant::now());
                }
                Err(err) => match &mut st.given_up {
                    Some((n, _, _)) => *n += 1,
                    None => st.given_up = Some((1, e.seq, err.to_string())),
                },
            }
        }
        e.complete(res);
        self.moved.notify_waiters();
    }

    /// The objects shipped since the last call (to flush their far copies).
    pub(crate) fn take_shipped(&self) -> Vec<ObjectId> {
        std::mem::take(&mut self.st.lock().shipped)
            .into_iter()
            .collect()
    }

    /// Put back objects whose far copies could not be flushed.
    pub(crate) fn unflushed(&self, oids: Vec<ObjectId>) {
        self.st.lock().shipped.extend(oids);
    }
}

/// Merge into `e` the queued writes from index `i` on that continue it directly
/// (same object and generation, starting where it ends), stopping at the first
/// other entry of its object: entries of other objects in between do not matter.
/// Returns how many were merged.
/// A write whose blocks an earlier entry still `held` (queued before `e`, or in
/// flight) is not merged: it must wait for that one.
fn merge_following(
    queue: &mut VecDeque<Entry>,
    i: usize,
    e: &mut Entry,
    held: &[(ObjectId, (u64, u64))],
) -> usize {
    let Op::Write { offset, data } = &e.op else {
        return 0;
    };
    let (offset, mut end) = (*offset, *offset + data.len() as u64);
    let mut parts: Vec<Bytes> = vec![data.clone()];
    let mut size = data.len();
    let mut j = i;
    while j < queue.len() && j < i + SCAN {
        let n = &queue[j];
        if n.oid != e.oid {
            j += 1;
            continue;
        }
        let next = match &n.op {
            Op::Write { offset: o, data: d }
                if *o == end
                    && n.generation == e.generation
                    && size + d.len() <= MERGE_MAX
                    && !overlaps(held, n.oid, span_of(&n.op)) =>
            {
                d.clone()
            }
            _ => break,
        };
        let mut n = queue.remove(j).expect("index in range");
        end += next.len() as u64;
        size += next.len();
        parts.push(next);
        e.weight += n.weight;
        e.near_applied = e.near_applied.min(n.near_applied);
        e.done.append(&mut n.done);
        e.at = e.at.min(n.at);
    }
    let merged = parts.len() - 1;
    if merged > 0 {
        let mut buf = BytesMut::with_capacity(size);
        for p in parts {
            buf.extend_from_slice(&p);
        }
        e.op = Op::Write {
            offset,
            data: buf.freeze(),
        };
    }
    merged
}

/// The lanes of a gateway, one per VDI with zone-sync writes.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<std::collections::BTreeMap<drove_types::VdiId, Arc<Lane>>>,
}

impl Lanes {
    /// The lane of VDI `id`, made if missing.
    pub(crate) fn lane(&self, id: drove_types::VdiId) -> Arc<Lane> {
        self.lanes.lock().entry(id).or_default().clone()
    }

    /// The lane of VDI `id`, if it has one.
    pub(crate) fn get(&self, id: drove_types::VdiId) -> Option<Arc<Lane>> {
        self.lanes.lock().get(&id).cloned()
    }

    /// Every lane's VDI and lag.
    pub(crate) fn lags(&self) -> Vec<(drove_types::VdiId, Lag)> {
        let lanes: Vec<_> = self
            .lanes
            .lock()
            .iter()
            .map(|(id, l)| (*id, l.clone()))
            .collect();
        lanes.into_iter().map(|(id, l)| (id, l.lag())).collect()
    }

    /// Forget the lane of VDI `id` when it is empty (the VDI left this node).
    pub(crate) fn forget_idle(&self, id: drove_types::VdiId) {
        let mut lanes = self.lanes.lock();
        if lanes.get(&id).is_some_and(|l| !l.pending()) {
            lanes.remove(&id);
        }
    }
}

#[cfg(test)]
#[path = "ship_tests.rs"]
mod tests;
