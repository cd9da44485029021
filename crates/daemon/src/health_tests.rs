use super::*;
use crate::wan::LagReport;
use drove_replica::Progress;
use drove_types::{Epoch, NodeInfo, WritePolicy};

/// Three up nodes in two zones at epoch 7.
fn state() -> MetaState {
    let mut s = MetaState::default();
    s.map.epoch = Epoch(7);
    for (id, zone) in [(1, "a"), (2, "a"), (3, "b")] {
        s.map
            .nodes
            .insert(NodeId(id), NodeInfo::new(NodeId(id), zone));
    }
    s.settings.default_copies = 2;
    // As a cluster of this build is: its first node's record set the level.
    s.settings.feature_level = drove_types::FEATURE_LEVEL;
    s
}

fn healthy(node: u64) -> LocalHealth {
    LocalHealth {
        node_id: NodeId(node),
        unix_ms: 1_000_000,
        recovery: Progress {
            epoch: 7,
            clean: true,
            ..Default::default()
        },
        disk_bytes: Some(100 << 30),
        disk_free_bytes: Some(60 << 30),
        disk_reserve_bytes: Some(1 << 30),
        data_dir: Some(format!("/var/lib/drove/node{node}")),
        meta_stopped: None,
        disk_failed: None,
        lags: Vec::new(),
    }
}

fn answer(node: u64, h: LocalHealth) -> Answer {
    Answer {
        node: NodeId(node),
        reply: Ok(h),
        asked_ms: 1_000_000 - 2,
        answered_ms: 1_000_000 + 2,
    }
}

fn all_healthy() -> Vec<Answer> {
    (1..=3).map(|n| answer(n, healthy(n))).collect()
}

/// [`super::judge`] without voters (no voter check): the checks here are the others.
fn judge(me: NodeId, q: Option<Duration>, s: &MetaState, answers: &[Answer]) -> Health {
    super::judge(me, q, s, &[], answers)
}

const FRESH: Option<Duration> = Some(Duration::from_millis(400));

fn levels(h: &Health) -> Vec<(Level, &str)> {
    h.checks
        .iter()
        .map(|c| (c.level, c.check.as_str()))
        .collect()
}

#[test]
fn test_a_healthy_cluster_is_ok_with_one_ok_finding_per_check() {
    let h = judge(NodeId(1), FRESH, &state(), &all_healthy());
    assert_eq!(h.status, Level::Ok, "{h:?}");
    let names: Vec<&str> = h.checks.iter().map(|c| c.check.as_str()).collect();
    assert_eq!(
        names,
        ["quorum", "nodes", "recovery", "disk", "clock", "lag"],
        "{h:?}"
    );
    assert!(h.checks[1].message.contains("3 of 3 nodes up"), "{h:?}");
    assert!(h.checks[3].message.contains("40 % used"), "{h:?}");
}

#[test]
fn test_no_quorum_is_an_error_and_comes_first() {
    let h = judge(
        NodeId(2),
        Some(Duration::from_secs(9)),
        &state(),
        &all_healthy(),
    );
    assert_eq!(h.status, Level::Err);
    assert_eq!(levels(&h)[0], (Level::Err, "quorum"));
    assert!(h.checks[0].message.contains("9.0 s ago"), "{h:?}");
    let never = judge(NodeId(2), None, &state(), &all_healthy());
    assert_eq!(never.status, Level::Err);
    assert!(never.checks[0].message.contains("since it started"));
    assert_eq!(never.quorum_age_ms, None);
}

#[test]
fn test_a_node_down_warns_and_as_many_down_as_copies_is_an_error() {
    let mut s = state();
    s.map.nodes.get_mut(&NodeId(3)).unwrap().state = NodeState::Down;
    let answers: Vec<Answer> = (1..=2).map(|n| answer(n, healthy(n))).collect();
    let h = judge(NodeId(1), FRESH, &s, &answers);
    assert_eq!(h.status, Level::Warn, "{h:?}");
    assert_eq!(levels(&h)[0], (Level::Warn, "nodes"));
    assert!(h.checks[0].message.contains("3 (zone b) down"), "{h:?}");
    s.map.nodes.get_mut(&NodeId(2)).unwrap().state = NodeState::Down;
    let h = judge(NodeId(1), FRESH, &s, &answers[..1]);
    assert_eq!(h.status, Level::Err, "{h:?}");
    assert!(h.checks[0].message.contains("no reachable copy"), "{h:?}");
}

#[test]
fn test_recovery_and_a_node_that_does_not_answer_warn() {
    let mut answers = all_healthy();
    let mut r = healthy(2);
    r.recovery = Progress {
        epoch: 7,
        total: 100,
        done: 40,
        failed: 1,
        clean: false,
        ..Default::default()
    };
    answers[1] = answer(2, r);
    answers[2].reply = Err("connection refused".into());
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(h.status, Level::Warn, "{h:?}");
    let warned: Vec<&HealthCheck> = h.checks.iter().filter(|c| c.level == Level::Warn).collect();
    assert_eq!(warned.len(), 2, "{h:?}");
    assert!(warned
        .iter()
        .any(|c| c.check == "reach" && c.message.contains("node 3")));
    assert!(warned.iter().any(|c| c.check == "recovery"
        && c.message
            .contains("40 of 100 objects done (1 failed, retried)")));
    // A node still at an older epoch has not begun.
    let mut old = healthy(3);
    old.recovery.epoch = 6;
    let h = judge(NodeId(1), FRESH, &state(), &[answer(3, old)]);
    assert!(h.checks[0]
        .message
        .contains("not yet begun recovering to epoch 7"));
}

#[test]
fn test_recovery_held_back_by_a_full_disk_says_so() {
    let mut answers = all_healthy();
    let mut r = healthy(2);
    r.recovery = Progress {
        epoch: 7,
        total: 100,
        done: 10,
        clean: false,
        waiting_full: 90,
        disk_used_pct: Some(91.4),
        ..Default::default()
    };
    answers[1] = answer(2, r);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(h.status, Level::Warn, "{h:?}");
    let rec = h.checks.iter().find(|c| c.check == "recovery").unwrap();
    assert!(
        rec.message
            .contains("90 held back: its disk is 91% full, at or past the cluster's backfill-full"),
        "{rec:?}"
    );
}

#[test]
fn test_an_answer_from_another_node_than_asked_is_not_taken() {
    let answers = vec![answer(2, healthy(3))];
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(levels(&h)[0], (Level::Warn, "reach"), "{h:?}");
}

#[test]
fn test_disk_near_full_warns_and_full_is_an_error() {
    let mut answers = all_healthy();
    let mut near = healthy(2);
    near.disk_free_bytes = Some(10 << 30);
    answers[1] = answer(2, near);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(levels(&h)[0], (Level::Warn, "disk"), "{h:?}");
    assert!(h.checks[0]
        .message
        .contains("node 2's disk (/var/lib/drove/node2) is 90 % used"));
    let mut full = healthy(3);
    full.disk_free_bytes = Some(1 << 20);
    answers[2] = answer(3, full);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(h.status, Level::Err);
    let msg = &h.checks[0].message;
    assert!(
        msg.contains("node 3's disk (/var/lib/drove/node3)"),
        "{h:?}"
    );
    assert!(msg.contains("fail with ENOSPC"), "{h:?}");
}

#[test]
fn test_a_disk_below_the_reserve_is_an_error_however_big() {
    let mut answers = all_healthy();
    let mut low = healthy(2);
    // 10 TB with 50 GB free: 99.5 % used, and below a 64 GB reserve.
    low.disk_bytes = Some(10_000 << 30);
    low.disk_free_bytes = Some(50 << 30);
    low.disk_reserve_bytes = Some(64 << 30);
    answers[1] = answer(2, low.clone());
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(levels(&h)[0], (Level::Err, "disk"), "{h:?}");
    assert!(
        h.checks[0].message.contains("below the 64G it keeps"),
        "{h:?}"
    );
    // Above its reserve and under 85 %: nothing to say.
    low.disk_bytes = Some(100 << 30);
    low.disk_free_bytes = Some(50 << 30);
    low.disk_reserve_bytes = Some(1 << 30);
    answers[1] = answer(2, low);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(h.status, Level::Ok, "{h:?}");
}

#[test]
fn test_a_node_whose_metadata_stopped_is_an_error() {
    let mut answers = all_healthy();
    let mut dead = healthy(2);
    dead.meta_stopped = Some("No space left on device".into());
    answers[1] = answer(2, dead);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(levels(&h)[0], (Level::Err, "meta"), "{h:?}");
    assert!(
        h.checks[0]
            .message
            .contains("node 2's metadata service stopped: No space"),
        "{h:?}"
    );
}

#[test]
fn test_clock_skew_beyond_the_round_trip_warns() {
    let mut answers = all_healthy();
    let mut ahead = healthy(3);
    ahead.unix_ms += 2_000;
    answers[2] = answer(3, ahead);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(levels(&h)[0], (Level::Warn, "clock"), "{h:?}");
    assert!(h.checks[0].message.contains("2.0 s ahead of node 1's"));
    // The same difference with a 5 s round trip proves nothing.
    let mut slow = answer(3, {
        let mut h = healthy(3);
        h.unix_ms += 2_000;
        h
    });
    slow.asked_ms -= 2_500;
    slow.answered_ms += 2_500;
    let h = judge(NodeId(1), FRESH, &state(), &[slow]);
    assert_eq!(h.status, Level::Ok, "{h:?}");
}

#[test]
fn test_a_lag_near_its_bound_warns() {
    let lag = |seconds: f64, bytes: u64| LagReport {
        vdi: "vm1".into(),
        policy: WritePolicy::ZoneSync,
        holder: Some(NodeId(2)),
        bytes,
        writes: 3,
        seconds,
        max_lag_ms: 5_000,
        max_lag_bytes: 256 << 20,
    };
    let mut answers = all_healthy();
    let mut h2 = healthy(2);
    h2.lags = vec![lag(0.3, 1 << 20)];
    answers[1] = answer(2, h2.clone());
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(h.status, Level::Ok, "{h:?}");
    assert!(h
        .checks
        .iter()
        .any(|c| c.check == "lag" && c.message.contains("1 zone-sync VDI(s)")));
    h2.lags = vec![lag(0.3, 200 << 20)];
    answers[1] = answer(2, h2.clone());
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(levels(&h)[0], (Level::Warn, "lag"), "{h:?}");
    assert!(h.checks[0]
        .message
        .contains("VDI 'vm1' (written through node 2)"));
    h2.lags = vec![lag(5.5, 1 << 20)];
    answers[1] = answer(2, h2);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert!(h.checks[0].message.contains("being slowed"), "{h:?}");
}

#[test]
fn test_noout_is_a_warning_while_set() {
    let mut s = state();
    s.settings.noout = true;
    let h = judge(NodeId(1), FRESH, &s, &all_healthy());
    assert_eq!(h.status, Level::Warn, "{h:?}");
    assert_eq!(levels(&h)[0], (Level::Warn, "noout"));
    assert!(h.checks[0].message.contains("not re-replicated"), "{h:?}");
    s.settings.noout = false;
    let h = judge(NodeId(1), FRESH, &s, &all_healthy());
    assert_eq!(h.status, Level::Ok, "{h:?}");
}

#[test]
fn test_the_voters_check_is_part_of_the_verdict() {
    // Zones a (1, 2) and b (3), voters 1, 2, 3: losing zone a loses the majority.
    let h = super::judge(
        NodeId(1),
        FRESH,
        &state(),
        &[NodeId(1), NodeId(2), NodeId(3)],
        &all_healthy(),
    );
    assert_eq!(h.status, Level::Warn, "{h:?}");
    assert_eq!(levels(&h)[0], (Level::Warn, "voters"));
    assert!(
        h.checks[0]
            .message
            .starts_with("losing zone a would stop the metadata: it holds 2 of 3 voters"),
        "{h:?}"
    );
    // A witness down is said, but holds no copy: with VDIs of one copy it is a
    // warning, not the error a data node down would be.
    let mut s = state();
    s.settings.default_copies = 1;
    let mut w = NodeInfo::new(NodeId(4), "w");
    w.witness = true;
    w.weight = 0;
    w.state = NodeState::Down;
    s.map.nodes.insert(NodeId(4), w);
    let h = judge(NodeId(1), FRESH, &s, &all_healthy());
    assert_eq!(h.status, Level::Warn, "{h:?}");
    assert!(
        h.checks[0].message
            == "node(s) 4 (zone w) down: 3 of 4 nodes up; witnesses hold no data: only the \
                metadata voters are fewer",
        "{h:?}"
    );
}

#[test]
fn test_a_failed_disk_is_an_error_naming_the_node_and_the_disk_even_when_down() {
    const WHY: &str = "The disk at /var/lib/drove/node3/store failed (EIO: object 1: write) \
                       at 2026-11-27T23:00:00Z: this node serves nothing from it";
    let mut s = state();
    s.map.nodes.get_mut(&NodeId(3)).unwrap().state = NodeState::Down;
    let mut failed = healthy(3);
    failed.disk_failed = Some(WHY.into());
    // Node 3 is down; it answers and names its disk.
    let mut answers = all_healthy();
    answers[2] = answer(3, failed.clone());
    let h = judge(NodeId(1), FRESH, &s, &answers);
    assert_eq!(h.status, Level::Err, "{h:?}");
    assert_eq!(levels(&h)[0], (Level::Err, "disk"), "{h:?}");
    assert!(
        h.checks[0].message.starts_with(&format!("node 3: {WHY}")),
        "{h:?}"
    );
    // Only the one finding for disks, not an "ok" one beside it.
    assert_eq!(
        h.checks.iter().filter(|c| c.check == "disk").count(),
        1,
        "{h:?}"
    );
    // A down node that does not answer is no finding of its own: the nodes check
    // says it is down.
    answers[2].reply = Err("connection refused".into());
    let h = judge(NodeId(1), FRESH, &s, &answers);
    assert_eq!(h.status, Level::Warn, "{h:?}");
    assert!(!h.checks.iter().any(|c| c.check == "reach"), "{h:?}");
    // Another node's answer naming node 3's disk is not believed.
    let mut other = failed.clone();
    other.node_id = NodeId(2);
    answers[2] = answer(3, other);
    let h = judge(NodeId(1), FRESH, &s, &answers);
    assert!(!h.checks.iter().any(|c| c.level == Level::Err), "{h:?}");
    // Still up (its own report raced the mark-down): the same error.
    let mut answers = all_healthy();
    answers[2] = answer(3, failed);
    let h = judge(NodeId(1), FRESH, &state(), &answers);
    assert_eq!(levels(&h)[0], (Level::Err, "disk"), "{h:?}");
}
