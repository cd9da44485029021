//! Write-lock renewals without log entries: the holder of a VDI's lock renews its
//! lease with the leader, which confirms with a heartbeat round that it still leads
//! (the read-index of [`crate::read`]), checks the lock in its applied state and
//! answers. No fsync is on that path: a disk that takes a second per fsync beside
//! the VMs' writes no longer lets leases run out.
//!
//! What the leader confirmed reaches the lock table later, in one
//! [`Command::ExtendLeases`] for every renewal since the last one: ahead of the next
//! commands it proposes (so a command that looks at a lease sees every renewal
//! confirmed before it was proposed), and on its own after [`FLUSH_AFTER`] (so
//! the table shown to operators is at most that much behind).
//!
//! Two rules keep a lease confirmed here from being handed to another node:
//! - While a lock request for a VDI is being committed, renewals of that VDI are
//!   refused ("try again"): a takeover decided on the table without a renewal that
//!   was confirmed meanwhile could otherwise win.
//! - A new leader does not know what its predecessor confirmed and did not write
//!   down. The first command of each term extends every lock by its lease and a
//!   margin ([`MetaState::new_term`]); any renewal the old leader confirmed was
//!   confirmed by a majority's heartbeat before that term began, so it ends before.
//!
//! The holder counts its lease from *before* it asked, as with a committed grant,
//! so it never believes in a longer lease than the leader recorded.
use crate::meta::{unix_now_ms as now_ms, Meta, ToLeader};
use crate::remote::{post, retry, Attempt, Wire};
use crate::state::lease::{lease_of, LeaseExtension};
use crate::state::{no_vdi, Command, MetaState, VdiLock, MAX_CLOCK_SKEW_MS, MAX_LEASE_MS};
use crate::types::Request;
use drove_types::clock::Instant;
use drove_types::{Error, ErrorKind, NodeId, Result, VdiId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// How long a confirmed renewal may wait for a command to carry it into the table.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_secs(2);
/// How long one renewal is tried (the holder sends another beside a slow one).
const RENEW_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest VDI name a renewal may carry (names are far shorter).
const MAX_NAME: usize = 1024;

/// A holder's request to extend its lease: `POST /meta/renew`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Renew {
    /// VDI name.
    pub vdi: String,
    /// The holder.
    pub node: NodeId,
    /// The holder's run ([`VdiLock::incarnation`]).
    pub incarnation: u64,
    /// The generation it holds.
    pub generation: u64,
    /// The holder's clock when it asked, milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// Lease length; never longer than the one the lock was granted with.
    pub lease_ms: u64,
}

/// The leader's record of renewals not yet in the table, and of lock requests
/// being committed.
#[derive(Default)]
pub(crate) struct Leases {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Confirmed renewals to write down, one per lock.
    pending: BTreeMap<VdiId, LeaseExtension>,
    /// When the oldest of them was confirmed.
    oldest: Option<Instant>,
    /// VDI names with a lock request in the entry being committed.
    in_flight: HashMap<String, usize>,
}

/// What the batcher puts ahead of a batch, and must report back on.
pub(crate) struct Proposal {
    /// [`Command::ExtendLeases`] with the renewals to write down, if any.
    pub(crate) extend: Option<Command>,
    /// The VDI names marked in flight.
    names: Vec<String>,
}

impl Leases {
    /// Confirm `r` against `state()`, taken under the table's lock so that it holds
    /// every entry applied before a lock request left the in-flight set. The
    /// caller has confirmed that this node leads and applied the read index.
    pub(crate) fn renew(
        &self,
        state: impl FnOnce() -> Arc<MetaState>,
        r: &Renew,
    ) -> std::result::Result<VdiLock, (ErrorKind, String)> {
        check(r)?;
        let mut inner = self.inner.lock();
        if inner.in_flight.contains_key(&r.vdi) {
            return Err((
                ErrorKind::Unavailable,
                format!(
                    "A lock request for VDI '{}' is being committed; renew again",
                    r.vdi
                ),
            ));
        }
        let state = state();
        let v = state.vdis.get(&r.vdi).ok_or_else(|| no_vdi(&r.vdi))?;
        let lost = |why: String| {
            Err((
                ErrorKind::Locked,
                format!(
                    "VDI '{}' lost its write lock on node {}: {why}",
                    r.vdi, r.node
                ),
            ))
        };
        let Some(l) = state.locks.get(&v.id) else {
            return lost("it was released or broken".into());
        };
        if l.owner != r.node || l.incarnation != r.incarnation {
            return lost(format!("node {} holds it now", l.owner));
        }
        if l.generation != r.generation {
            return lost(format!(
                "it holds generation {}, not {}",
                l.generation, r.generation
            ));
        }
        if l.handover_to.is_some() {
            return Err((
                ErrorKind::Locked,
                format!(
                    "VDI '{}' is being handed over; node {} may not renew",
                    r.vdi, r.node
                ),
            ));
        }
        let lease = r.lease_ms.min(lease_of(l));
        let until = r.now_ms.saturating_add(lease);
        let e = inner.pending.entry(v.id).or_insert(LeaseExtension {
            vdi: v.id,
            owner: l.owner,
            incarnation: l.incarnation,
            generation: l.generation,
            until_ms: until,
        });
        e.until_ms = e.until_ms.max(until);
        inner.oldest.get_or_insert_with(Instant::now);
        let mut lock = l.clone();
        lock.expires_ms = lock.expires_ms.max(until);
        lock.home_zone = v.home_zone.clone();
        // The lease granted now, which the holder counts on.
        lock.lease_ms = lease;
        Ok(lock)
    }

    /// Before the batcher proposes `reqs`: mark their lock requests in flight and
    /// take the renewals to write down ahead of them. [`Leases::proposed`] must
    /// follow once the proposal has an answer.
    pub(crate) fn before<'a>(&self, reqs: impl IntoIterator<Item = &'a Request>) -> Proposal {
        let names: Vec<String> = reqs
            .into_iter()
            .filter_map(|r| match &r.cmd {
                Command::AcquireLock { vdi, .. } => Some(vdi.clone()),
                _ => None,
            })
            .collect();
        let mut inner = self.inner.lock();
        for n in &names {
            *inner.in_flight.entry(n.clone()).or_insert(0) += 1;
        }
        let leases: Vec<LeaseExtension> =
            std::mem::take(&mut inner.pending).into_values().collect();
        inner.oldest = None;
        Proposal {
            extend: (!leases.is_empty()).then_some(Command::ExtendLeases { leases }),
            names,
        }
    }

    /// The proposal made after [`Leases::before`] has its answer. A failed one
    /// loses its renewals: this node no longer leads (the next leader extends every
    /// lock) or stopped.
    pub(crate) fn proposed(&self, p: Proposal) {
        let mut inner = self.inner.lock();
        for n in p.names {
            if let Some(c) = inner.in_flight.get_mut(&n) {
                *c -= 1;
                if *c == 0 {
                    inner.in_flight.remove(&n);
                }
            }
        }
    }

    /// Whether confirmed renewals have waited [`FLUSH_AFTER`] for a command.
    pub(crate) fn flush_due(&self) -> bool {
        self.inner
            .lock()
            .oldest
            .is_some_and(|t| t.elapsed() >= FLUSH_AFTER)
    }
}

/// Field checks, against the node's own limits, before anything is looked up.
fn check(r: &Renew) -> std::result::Result<(), (ErrorKind, String)> {
    if r.vdi.is_empty() || r.vdi.len() > MAX_NAME {
        return Err((
            ErrorKind::Invalid,
            format!("Bad VDI name in a renewal ({} bytes)", r.vdi.len()),
        ));
    }
    if r.lease_ms == 0 || r.lease_ms > MAX_LEASE_MS {
        return Err((
            ErrorKind::Invalid,
            format!("Bad lease {} ms: use 1 to {MAX_LEASE_MS} ms", r.lease_ms),
        ));
    }
    let skew = r.now_ms.abs_diff(now_ms());
    if skew > MAX_CLOCK_SKEW_MS {
        return Err((
            ErrorKind::Invalid,
            format!(
                "Renewal stamped {} ms, {skew} ms away from the leader's clock: fix the clocks (NTP)",
                r.now_ms
            ),
        ));
    }
    Ok(())
}

impl Meta {
    /// Renew a write lock this node holds; the answer carries the lease's new end.
    /// `Locked` when the lock is no longer this holder's (released, broken, taken
    /// over, being handed over), `Unavailable` when it cannot be confirmed now.
    pub async fn renew_lock(&self, r: Renew) -> Result<VdiLock> {
        let deadline = Instant::now() + RENEW_TIMEOUT;
        retry(deadline, "Cannot renew the write lock", |hint| {
            self.renew_once(&r, hint, deadline)
        })
        .await
    }

    async fn renew_once(
        &self,
        r: &Renew,
        hint: Option<String>,
        deadline: Instant,
    ) -> Attempt<VdiLock> {
        let addr = match self.to_leader(hint) {
            ToLeader::Closed => {
                return Attempt::Fail(Error::unavailable("Metadata service stopped"))
            }
            ToLeader::Unknown => return ToLeader::no_leader(),
            ToLeader::Here => return self.local_renew(r).await.into(),
            ToLeader::There(addr) => addr,
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        post(&self.client, &addr, "/meta/renew", r, left).await
    }

    /// On the leader: confirm the leadership, catch up with the read index, then
    /// check and record the renewal.
    pub(crate) async fn local_renew(&self, r: &Renew) -> Wire<VdiLock> {
        let index = match self.local_read_index().await {
            Wire::Ok(i) => i,
            Wire::Err { kind, msg } => return Wire::Err { kind, msg },
            Wire::NotLeader { leader } => return Wire::NotLeader { leader },
        };
        if let Some(index) = index {
            if let Err(e) = self
                .raft
                .wait(Some(Duration::from_secs(2)))
                .applied_index_at_least(Some(index), "lease renewal")
                .await
            {
                return Wire::unavailable(format!(
                    "The leader has not applied the metadata up to index {index}: {e}"
                ));
            }
        }
        match self.leases.renew(|| self.state(), r) {
            Ok(l) => {
                self.count_renewal("ok");
                Wire::Ok(l)
            }
            Err((kind, msg)) => {
                self.count_renewal(if kind == ErrorKind::Unavailable {
                    "retry"
                } else {
                    "refused"
                });
                Wire::Err { kind, msg }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::lock_tests::{acquire, lock_of, state_with};
    use crate::types::RequestId;

    fn held() -> (Arc<MetaState>, VdiLock) {
        let mut s = state_with("vm");
        let l = lock_of(acquire(&mut s, 1, now_ms()));
        (Arc::new(s), l)
    }

    fn renewal(l: &VdiLock) -> Renew {
        Renew {
            vdi: "vm".into(),
            node: l.owner,
            incarnation: l.incarnation,
            generation: l.generation,
            now_ms: now_ms(),
            lease_ms: 60_000,
        }
    }

    fn acquire_req(vdi: &str, node: u64) -> Request {
        Request {
            id: RequestId { client: 1, seq: 1 },
            now: 0,
            cmd: Command::AcquireLock {
                vdi: vdi.into(),
                node: NodeId(node),
                now_ms: 0,
                lease_ms: 1000,
                incarnation: 0,
            },
        }
    }

    #[test]
    fn test_a_renewal_is_capped_at_the_granted_lease_and_written_down_once() {
        let (s, l) = held();
        let leases = Leases::default();
        let r = renewal(&l);
        let got = leases.renew(|| s.clone(), &r).unwrap();
        // Asked for 60 s; the lock was granted for 10 s.
        assert_eq!((got.expires_ms, got.lease_ms), (r.now_ms + 10_000, 10_000));
        assert_eq!(got.generation, l.generation);
        let p = leases.before(&[]);
        match &p.extend {
            Some(Command::ExtendLeases { leases }) => {
                assert_eq!(leases.len(), 1);
                assert_eq!(leases[0].until_ms, r.now_ms + 10_000);
            }
            other => panic!("expected the renewal ahead of the batch: {other:?}"),
        }
        leases.proposed(p);
        assert!(leases.before(&[]).extend.is_none(), "taken once");
    }

    #[test]
    fn test_no_renewal_while_a_lock_request_for_the_vdi_is_being_committed() {
        let (s, l) = held();
        let leases = Leases::default();
        let p = leases.before(&[acquire_req("vm", 2)]);
        let (kind, msg) = leases.renew(|| s.clone(), &renewal(&l)).unwrap_err();
        assert_eq!(kind, ErrorKind::Unavailable, "{msg}");
        leases.proposed(p);
        assert!(leases.renew(|| s.clone(), &renewal(&l)).is_ok());
    }

    #[test]
    fn test_a_renewal_the_lock_table_does_not_back_is_refused() {
        let (s, l) = held();
        let leases = Leases::default();
        let locked = |r: Renew| {
            let (kind, msg) = leases.renew(|| s.clone(), &r).unwrap_err();
            assert_eq!(kind, ErrorKind::Locked, "{msg}");
            msg
        };
        let mut r = renewal(&l);
        r.node = NodeId(2);
        assert!(locked(r).contains("node 1 holds it"));
        let mut r = renewal(&l);
        r.incarnation += 1;
        locked(r);
        let mut r = renewal(&l);
        r.generation += 1;
        assert!(locked(r).contains("generation"));
        // Handed over: no renewal.
        let mut s2 = (*s).clone();
        s2.apply(
            &Command::RequestHandover {
                vdi: "vm".into(),
                to: NodeId(2),
            },
            now_ms() / 1000,
        )
        .unwrap();
        let s2 = Arc::new(s2);
        let (kind, msg) = leases.renew(|| s2.clone(), &renewal(&l)).unwrap_err();
        assert_eq!(kind, ErrorKind::Locked);
        assert!(msg.contains("handed over"), "{msg}");
        // Nothing of the refused ones is written down.
        assert!(leases.before(&[]).extend.is_none());
    }

    #[test]
    fn test_hostile_renewal_fields_are_refused_before_any_lookup() {
        let (s, l) = held();
        let leases = Leases::default();
        for r in [
            Renew {
                vdi: "x".repeat(MAX_NAME + 1),
                ..renewal(&l)
            },
            Renew {
                vdi: String::new(),
                ..renewal(&l)
            },
            Renew {
                lease_ms: 0,
                ..renewal(&l)
            },
            Renew {
                lease_ms: MAX_LEASE_MS + 1,
                ..renewal(&l)
            },
            Renew {
                now_ms: now_ms() + MAX_CLOCK_SKEW_MS + 60_000,
                ..renewal(&l)
            },
        ] {
            let (kind, _) = leases.renew(|| s.clone(), &r).unwrap_err();
            assert_eq!(kind, ErrorKind::Invalid, "{r:?}");
        }
        let mut r = renewal(&l);
        r.vdi = "nope".into();
        assert_eq!(
            leases.renew(|| s.clone(), &r).unwrap_err().0,
            ErrorKind::NotFound
        );
    }
}
