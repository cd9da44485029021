//! Unit tests of lease renewals in the lock table: what the leader confirmed
//! extends only the lock it was confirmed for, and a new term extends every lock.
use super::lease::{LeaseExtension, NEW_LEADER_MARGIN_MS};
use super::lock_tests::{acquire, lock_of, state_with};
use super::*;

fn extension(l: &VdiLock, until_ms: u64) -> LeaseExtension {
    LeaseExtension {
        vdi: l.vdi,
        owner: l.owner,
        incarnation: l.incarnation,
        generation: l.generation,
        until_ms,
    }
}

fn extend(s: &mut MetaState, leases: Vec<LeaseExtension>, now: u64) -> ApplyResult {
    s.apply(&Command::ExtendLeases { leases }, now)
}

#[test]
fn test_a_confirmed_renewal_keeps_another_node_out_until_it_ends() {
    let mut s = state_with("vm");
    let l = lock_of(acquire(&mut s, 1, 1_000_000));
    assert_eq!((l.expires_ms, l.lease_ms), (1_010_000, 10_000));
    extend(&mut s, vec![extension(&l, 1_025_000)], 1_015).unwrap();
    // The committed grant alone would have ended at 1_010_000.
    let (kind, msg) = acquire(&mut s, 2, 1_020_000).unwrap_err();
    assert_eq!(kind, ErrorKind::Locked, "{msg}");
    let l2 = lock_of(acquire(&mut s, 2, 1_025_001));
    assert_eq!((l2.owner, l2.generation), (NodeId(2), l.generation + 1));
}

#[test]
fn test_a_renewal_of_a_lock_that_changed_hands_extends_nothing() {
    let mut s = state_with("vm");
    let old = lock_of(acquire(&mut s, 1, 1_000_000));
    let new = lock_of(acquire(&mut s, 2, 1_010_001));
    // Node 1's renewal, confirmed before node 2 took the lock, arrives late.
    extend(&mut s, vec![extension(&old, 1_050_000)], 1_011).unwrap();
    assert_eq!(s.locks[&new.vdi].expires_ms, new.expires_ms);
    assert_eq!(s.locks[&new.vdi].owner, NodeId(2));
    // Another generation or run of the same owner is no match either.
    let mut other = extension(&new, 1_060_000);
    other.generation += 1;
    let mut run = extension(&new, 1_060_000);
    run.incarnation += 1;
    extend(&mut s, vec![other, run], 1_011).unwrap();
    assert_eq!(s.locks[&new.vdi].expires_ms, new.expires_ms);
}

#[test]
fn test_a_renewal_beyond_the_longest_lease_is_refused_whole() {
    let mut s = state_with("vm");
    let l = lock_of(acquire(&mut s, 1, 1_000_000));
    let far = 1_000_000 + MAX_LEASE_MS + MAX_CLOCK_SKEW_MS + 1;
    let (kind, _) = extend(
        &mut s,
        vec![extension(&l, 1_012_000), extension(&l, far)],
        1_000,
    )
    .unwrap_err();
    assert_eq!(kind, ErrorKind::Invalid);
    assert_eq!(s.locks[&l.vdi].expires_ms, l.expires_ms, "nothing applied");
}

#[test]
fn test_each_new_term_extends_every_lock_once_by_its_lease() {
    let mut s = state_with("vm");
    let l = lock_of(acquire(&mut s, 1, 1_000_000));
    s.new_term(2, 1_009_000);
    let until = 1_009_000 + 10_000 + NEW_LEADER_MARGIN_MS;
    assert_eq!(s.locks[&l.vdi].expires_ms, until);
    assert_eq!(s.lease_term, 2);
    // The same term again (a later command of it) changes nothing.
    s.new_term(2, 1_015_000);
    assert_eq!(s.locks[&l.vdi].expires_ms, until);
    // Node 2 waits it out.
    assert!(acquire(&mut s, 2, until - 1).is_err());
    assert!(acquire(&mut s, 2, until + 1).is_ok());
}

#[test]
fn test_a_lock_recorded_without_its_lease_counts_the_default() {
    let mut s = state_with("vm");
    let l = lock_of(acquire(&mut s, 1, 1_000_000));
    s.locks.get_mut(&l.vdi).unwrap().lease_ms = 0;
    s.new_term(3, 1_000_000);
    assert_eq!(
        s.locks[&l.vdi].expires_ms,
        1_000_000 + lease::UNRECORDED_LEASE_MS + NEW_LEADER_MARGIN_MS
    );
}

#[test]
fn test_a_node_that_started_again_ends_the_leases_of_its_earlier_run_only() {
    let mut s = state_with("vm");
    let l = lock_of(acquire(&mut s, 1, 1_000_000));
    // The whole cluster restarted: the new term keeps every lock alive.
    s.new_term(9, 1_005_000);
    let (kind, _) = acquire(&mut s, 2, 1_006_000).unwrap_err();
    assert_eq!(kind, ErrorKind::Locked);
    // Node 2 starting again says nothing of node 1's run; node 1's run 0 still
    // holding it says nothing either.
    for (node, run) in [(2, 77), (1, 0)] {
        s.apply(
            &Command::ForgetRun {
                node: NodeId(node),
                incarnation: run,
            },
            1_006,
        )
        .unwrap();
        assert_eq!(
            acquire(&mut s, 2, 1_006_000).unwrap_err().0,
            ErrorKind::Locked
        );
    }
    // Node 1 started again as run 5: its run 0 is dead, and its lock free to take
    // at once, unsettled (the next holder repairs first).
    s.apply(
        &Command::ForgetRun {
            node: NodeId(1),
            incarnation: 5,
        },
        1_006,
    )
    .unwrap();
    let l2 = lock_of(acquire(&mut s, 2, 1_006_001));
    assert_eq!((l2.owner, l2.generation), (NodeId(2), l.generation + 1));
    assert!(s.settled.get(&l.vdi).copied().unwrap_or(0) < l.generation);
    // A node the cluster does not have is refused.
    let e = s
        .apply(
            &Command::ForgetRun {
                node: NodeId(42),
                incarnation: 1,
            },
            1_006,
        )
        .unwrap_err();
    assert_eq!(e.0, ErrorKind::NotFound);
}
