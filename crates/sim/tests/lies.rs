//! The simulator's disk lies (power losses, EIO, failed fsyncs, a full or slow
//! disk): seeds that found defects stay as regression tests, and the durability
//! check fails a run whose disks drop what they acknowledged durable.
use drove_sim::faults::{FaultKind, FaultOpts};
use drove_sim::run_seed;

fn power() -> FaultOpts {
    FaultOpts {
        kinds: vec![FaultKind::Power],
        ..FaultOpts::default()
    }
}

/// Every kind of fault for 20 s, on openraft (`--meta raft --time 20s`).
fn raft() -> FaultOpts {
    FaultOpts {
        meta: drove_sim::cluster::MetaMode::Raft,
        secs: 20,
        ..FaultOpts::default()
    }
}

fn show(r: &drove_sim::faults::SeedReport) -> String {
    format!("faults: {:#?}\nbroken: {:#?}", r.faults, r.violations)
}

/// `drove sim faults --seed 24 --faults power`: node 9 lost power 0.4 s after
/// writes to one of its copies and was back 0.9 s later, before the failure
/// detector marked it down, so the epoch had not moved. Its recovery record said
/// it was clean at that epoch, so every copy it held counted as current, although
/// the writes it had not flushed were gone; a FLUSH then succeeded on its stale
/// copy, and the replicas were later made identical from it: two writes
/// acknowledged durable were lost from every copy.
#[test]
fn test_a_node_back_from_a_power_loss_before_the_epoch_moved_does_not_serve_lost_writes() {
    let r = run_seed(24, &power()).unwrap();
    assert!(r.passed(), "{}", show(&r));
    // Since h/lies was merged onto main's clients (the daemon's Volume), the seed's
    // schedule differs (node 5 loses power for 687 ms): still one node back before
    // the failure detector's 3 s, the shape of the fault it was kept for.
    let quick = |f: &String| {
        f.split_once(": node ")
            .and_then(|(_, rest)| rest.split_once(" loses power for "))
            .and_then(|(_, ms)| ms.split_once(" ms"))
            .and_then(|(ms, _)| ms.parse::<u64>().ok())
            .is_some_and(|ms| ms < 3000)
    };
    assert!(
        r.faults.iter().any(quick),
        "the seed no longer makes the fault it was kept for: {}",
        show(&r)
    );
}

/// A disk whose flush makes nothing durable loses writes acknowledged durable at
/// the first power loss that takes every copy: the durability check must say so.
#[test]
fn test_the_checks_catch_a_write_acknowledged_durable_that_a_power_loss_took() {
    let opts = FaultOpts {
        sabotage_flush: true,
        ..power()
    };
    let r = (1..=10)
        .map(|seed| run_seed(seed, &opts).unwrap())
        .find(|r| !r.passed())
        .expect("ten runs on disks whose flushes keep nothing passed the checks");
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("was acknowledged durable")),
        "{}",
        show(&r)
    );
}

/// `drove sim faults --seed 1` (every kind, 40 s; also 96, 101, 199 and 271): after
/// a whole-site (or zone) power loss every node's host had booted since its clean
/// epoch, so every copy was pending. Copies torn in one block (a write cut by the
/// power loss) asked the other copies of their version for it to mend it, and each
/// refused, its own copy pending: the object was never recovered, the cluster never
/// clean and the block unreadable. A read to mend (`PeerReq::MendRead`) is now
/// answered whatever the copy's state.
#[test]
fn test_copies_torn_by_a_site_power_loss_mend_each_other_while_all_pending() {
    for seed in [1, 96, 101, 199, 271] {
        let r = run_seed(seed, &FaultOpts::default()).unwrap();
        assert!(r.passed(), "seed {seed}: {}", show(&r));
        assert!(
            r.faults.iter().any(|f| f.contains("loses power")),
            "seed {seed} no longer loses power: {}",
            show(&r)
        );
    }
}

/// Sync VDIs after one node's power loss (every kind, 40 s): `--seed 209` (and 92,
/// 64, 109, 161, 254) lost writes acknowledged durable, or read older ones, because
/// recovery preferred a home-zone copy that the power loss had set back to a far
/// copy known current (the home preference is for zone-sync copies only);
/// `--seed 205` and 263 because a node back from a power loss vouched for its own
/// stale copy.
#[test]
fn test_a_copy_set_back_by_a_power_loss_never_wins_over_one_that_kept_the_writes() {
    for seed in [64, 92, 109, 161, 205, 209, 254, 263] {
        let r = run_seed(seed, &FaultOpts::default()).unwrap();
        assert!(r.passed(), "seed {seed}: {}", show(&r));
    }
}

/// `drove sim faults --seed 265` (every kind, 40 s): vm0's write 799, acknowledged
/// durable on nodes 6, 5 and 9 at 27247 ms while node 6's disk took 4.6 s per
/// fsync, was gone from every copy after zone z3 then the whole site lost power.
/// Since 1a4846c (zone-sync admission) seed 265 no longer loses the whole site,
/// nor 34 since the gateway's fan-out runs in a task of its own; seeds 44 and 63
/// have the same faults in turn: a disk seconds per fsync, a zone's power loss,
/// then the site's.
#[test]
fn test_a_write_acknowledged_durable_survives_a_zone_then_a_site_power_loss() {
    for seed in [44, 63] {
        let r = run_seed(seed, &FaultOpts::default()).unwrap();
        assert_passed_after_a_site_power_loss(&r);
        for kind in ["per fsync", "zone z2 loses power"] {
            assert!(
                r.faults.iter().any(|f| f.contains(kind)),
                "seed {seed} no longer has \"{kind}\": {}",
                show(&r)
            );
        }
    }
}

/// `drove sim faults --seed 293` (every kind, 40 s): after the whole site lost
/// power, nodes 2 and 3 each held vm3's objects pending, at the version and with
/// the content node 4 had recovered from them, and each waited for itself for
/// good: each was the only node that took the writes of an epoch at which the
/// other was down, a copy whose host lost power answers for none of its writes,
/// so nobody ever answered for that epoch (and the node never became clean, which
/// alone clears the power loss). `--seed 91`: node 5, the only home copy up at
/// epoch 11 (z2 cut off and its nodes marked down one by one), waited for itself
/// after the site's power loss and zone z2's. A node whose answer is all there
/// will ever be for an epoch no longer waits for itself: the writes acknowledged
/// durable then are on its disk, and the others were on no copy that kept its
/// page cache.
#[test]
fn test_the_only_node_that_took_an_epochs_writes_does_not_wait_for_itself_after_a_power_loss() {
    for seed in [91, 293] {
        let r = run_seed(seed, &FaultOpts::default()).unwrap();
        assert!(r.passed(), "seed {seed}: {}", show(&r));
        assert!(
            r.faults
                .iter()
                .any(|f| f.contains("whole site loses power")),
            "seed {seed} no longer loses the site's power: {}",
            show(&r)
        );
    }
}

/// `drove sim faults --meta raft --seed 19 --time 20s` (also 20 and 39): recovery
/// was not clean 120 s after the heal, each time after a zone's or the site's
/// power loss: the same wait as seeds 91 and 293 above, a node that lost power
/// waiting for itself as the only node that took an epoch's writes.
#[test]
fn test_the_raft_metadata_runs_recover_after_a_zone_or_site_power_loss() {
    raft_seeds_pass(&[19, 20, 39], &["loses power"]);
}

/// Each of `seeds` passes on openraft, and still has a fault naming one of
/// `faults` (else the seed no longer tests what it was kept for).
fn raft_seeds_pass(seeds: &[u64], faults: &[&str]) {
    for &seed in seeds {
        let r = run_seed(seed, &raft()).unwrap();
        assert!(r.passed(), "seed {seed}: {}", show(&r));
        assert!(
            r.faults
                .iter()
                .any(|f| faults.iter().any(|k| f.contains(k))),
            "seed {seed} no longer has a fault of {faults:?}: {}",
            show(&r)
        );
    }
}

/// `drove sim faults --meta raft --seed 263 --time 20s`: writes acknowledged
/// durable on nodes 1, 3 and 5 read back as zeros after the whole site lost power.
/// Nodes 7 and 8 had recovered the object in a bulk pass, which flushed only at its
/// end; the power loss tore their copies, which kept the version without the
/// blocks, and the placed nodes took them as the source over node 1's copy, which
/// had the writes. A recovered copy is now flushed before it counts as current.
#[test]
fn test_a_copy_recovered_but_not_flushed_never_wins_after_a_site_power_loss() {
    let opts = raft();
    let r = run_seed(263, &opts).unwrap();
    assert_passed_after_a_site_power_loss(&r);
}

/// The seed passed, and still has the whole site lose power (the case it keeps).
fn assert_passed_after_a_site_power_loss(r: &drove_sim::SeedReport) {
    assert!(r.passed(), "{}", show(r));
    assert!(
        r.faults
            .iter()
            .any(|f| f.contains("whole site loses power")),
        "the seed no longer loses the site's power: {}",
        show(r)
    );
}

/// `drove sim faults --meta raft --seed 1546 --time 20s` (from the first raft run
/// past seed 400, which failed 22 of 3,300 seeds): zone z2 was lost (nodes 4 to 6
/// crashed, their page cache kept) and node 8, which shared a VDI's objects with
/// them, lost power. Back first, node 8 rightly waited for nodes 4 to 6, which had
/// taken the last writes; but nodes 1 and 7, placed in their stead, counted node
/// 8's copy as answering for those writes, took it and made it current, and when
/// z2 came back its copies were replaced by it: acknowledged writes lost. A copy
/// on a node not clean since it started (clean epoch 0: back from a power loss,
/// as in seed 3022, or on a new, empty disk, as in seed 2274) now answers for an
/// epoch's writes only when every other witness of the epoch answered too.
#[test]
fn test_a_copy_not_clean_since_its_node_started_does_not_answer_for_others_writes() {
    raft_seeds_pass(&[1546, 2274, 3022], &["loses power", "new, empty disk"]);
}

/// `drove sim faults --meta raft --seed 3223 --time 20s`: node 5 came back on a
/// new, empty disk while nodes 8 and 9, the only holders of an object placed on
/// it, were down after zone z3's power loss. It never heard of the object, worked
/// out its epochs and answered "none here, current" for it; when z3 came back,
/// nodes 8 and 9 took that answer over their own copies (unsure after the power
/// loss), and 35 writes acknowledged durable were gone. An object a peer back
/// since lists, placed here and not held here, is now recovered like one gained.
#[test]
fn test_a_node_on_a_new_disk_does_not_vouch_for_objects_it_never_heard_of() {
    raft_seeds_pass(&[3223], &["new, empty disk"]);
}

/// `drove sim faults --meta raft --seed 1306 --time 20s`: after the whole site lost
/// power, both home-zone copies of a zone-sync object were torn at one block, and
/// node 7 mended its copy from the far copy, of the same version but short of the
/// last writes shipped to it: a write acknowledged durable was replaced by an
/// older one everywhere. A home copy whose host lost power, when every other home
/// copy fails the block too, seals it as it stands instead. Seed 3016 keeps the
/// other side: the other home copy's disk had failed, and a first fix that never
/// asked the far copy left node 1's copy with one block flipped, unmended; it was
/// replaced whole by the far copy, short of two durable writes.
#[test]
fn test_a_torn_home_copy_is_not_mended_from_a_lagging_far_copy() {
    let r = run_seed(1306, &raft()).unwrap();
    assert_passed_after_a_site_power_loss(&r);
    let r = run_seed(3016, &raft()).unwrap();
    assert_passed_after_a_site_power_loss(&r);
}

/// `drove sim faults --meta raft --seed 1416 --time 20s`: after the whole site lost
/// power, node 7 held the only copy of an object's last version, torn. Node 8, on
/// which the object was placed at that version's epoch and no longer, was never
/// asked, so node 7 did not count its copy as alone in its version, never sealed
/// the torn block, and waited for itself: recovery never ended. Every node placed
/// since the version is now asked first.
#[test]
fn test_a_torn_copy_alone_in_its_version_asks_every_node_placed_since() {
    let r = run_seed(1416, &raft()).unwrap();
    assert_passed_after_a_site_power_loss(&r);
}

/// `drove sim faults --meta raft --seed 441 --time 20s` (also 1229 and 2169): the
/// final check's new writer found every VDI's lease still running. Voters moved
/// when zone z3 came back, a new metadata term began, and a new leader extends
/// every lease by its length and a margin: the check now waits that out too.
#[test]
fn test_the_final_lock_handover_waits_out_a_new_leaders_lease_extension() {
    for seed in [441, 1229, 2169] {
        let r = run_seed(seed, &raft()).unwrap();
        assert!(r.passed(), "seed {seed}: {}", show(&r));
    }
}

/// `drove sim faults --meta raft --seed 5432 --time 20s` (also 8539): a write
/// acknowledged as the whole site lost power was checked against the metadata of
/// no running node, an empty state, and reported as acknowledged without the lock.
/// While no node runs, the simulator now answers with the last state it saw.
#[test]
fn test_a_write_acknowledged_as_the_site_loses_power_is_checked_against_the_last_lock() {
    raft_seeds_pass(&[5432, 8539], &["whole site loses power"]);
}

/// `drove sim faults --meta raft --seed 4181 --time 20s` (from the first 10,000-seed
/// raft run): zone z3 was cut off for 2.8 s. Its gateway, node 7, judged both home
/// copies of a zone-sync VDI silent across the cut; its verdicts committed 0.6 s
/// after the heal, after the other side had marked nodes 8 and 9 of z3 down. The
/// copy placed in their stead was recovered from the far copy, short of writes
/// acknowledged durable, and replaced the home copies when they came back. From
/// feature level 4 a verdict on another zone is refused when the judge's zone lost
/// a node since the judge's map.
#[test]
fn test_a_verdict_from_a_zone_cut_off_is_refused_once_its_zone_was_marked_down() {
    raft_seeds_pass(&[4181], &["is cut off"]);
}

/// `drove sim faults --meta raft --seed 9679 --time 20s`: node 1, back on a new,
/// empty disk, answered "no copy" with clean epoch 0, and that answer counted as
/// the sure witness of an epoch whose writes its old disk had taken. Node 7, whose
/// power loss had taken an unflushed write, made its copy current without waiting
/// for node 9, the one copy that held it, and node 9's copy was replaced by it. An
/// absence from a node not clean since it started is now unsure, as a copy is.
#[test]
fn test_no_copy_on_a_new_disk_does_not_answer_for_the_old_disks_writes() {
    raft_seeds_pass(&[9679], &["new, empty disk"]);
}

/// `drove sim faults --meta raft --seed 8017 --time 20s`: after the whole site lost
/// power, node 7 held the only copy of an object's last version, torn, no longer
/// placed on it. It became clean (its placed copies recovered) before the others
/// asked it to mend that copy, and a clean node no longer counted its copies as
/// touched by the power loss: it never sealed the torn block, and recovery waited
/// for it for ever. A copy held since the power loss stays unsure until it is made
/// current.
#[test]
fn test_a_torn_leftover_is_still_sealed_after_its_node_is_clean() {
    let r = run_seed(8017, &raft()).unwrap();
    assert_passed_after_a_site_power_loss(&r);
}

/// `drove sim faults --meta raft --seed 9469 --time 20s`: node 6 crashed with a
/// write in its page cache and was marked down; the flush after it was acknowledged
/// on the others. Then the whole site lost power and node 6's copy lost the write,
/// keeping its version. All copies tied on version and clean epoch (0 after the
/// power loss) and node 5 took node 6's; the copies were then made identical to it.
/// Among copies of one version, one placed at every epoch since is now taken first.
/// Since the gateway's fan-out runs in a task of its own, seed 9469 no longer has
/// those faults; seeds 34 and 180 crash a node, then the whole site loses power
/// while it is down.
#[test]
fn test_a_copy_that_missed_a_flush_does_not_win_a_tie_after_a_site_power_loss() {
    for seed in [34, 180] {
        let r = run_seed(seed, &raft()).unwrap();
        assert_passed_after_a_site_power_loss(&r);
        let at = |k: &str| r.faults.iter().position(|f| f.contains(k));
        assert!(
            matches!(
                (at("crashes"), at("whole site loses power")),
                (Some(c), Some(p)) if c < p
            ),
            "seed {seed} no longer crashes a node before the site's power loss: {}",
            show(&r)
        );
    }
}
