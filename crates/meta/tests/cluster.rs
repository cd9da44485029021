//! Real clusters of `Meta` nodes over HTTP on 127.0.0.1: formation, forwarded writes,
//! learners beyond `max_voters`, a full restart from disk, leader loss, and a joiner
//! brought up to date by a snapshot.
mod common;

use common::{
    agreed_leader, agreed_leader_among, all, init_tracing, restart, start, wait_until, Node, READY,
};
use drove_meta::{Command, Reply};
use drove_types::{ErrorKind, NodeId, ReplicationMode, WritePolicy, DEFAULT_OBJECT_SIZE};
use std::time::Duration;

fn create(name: &str, copies: Option<u8>) -> Command {
    Command::CreateVdi {
        name: name.to_string(),
        size: 1 << 30,
        copies,
        mode: ReplicationMode::Direct,
        object_size: DEFAULT_OBJECT_SIZE,
        now: 1_700_000_000,
        home_zone: None,
        home_copies: None,
        policy: WritePolicy::Sync,
        max_lag_ms: None,
        max_lag_bytes: None,
        qos: Default::default(),
    }
}

fn ids(v: &[NodeId]) -> Vec<u64> {
    v.iter().map(|n| n.0).collect()
}

/// Start node 1 (bootstrap) and two joiners; wait until all three are ready and vote.
async fn three(dirs: &[tempfile::TempDir]) -> Vec<Node> {
    let n1 = start(dirs[0].path(), None).await;
    n1.meta.ready(READY).await.expect("node 1 ready");
    let n2 = start(dirs[1].path(), Some(n1.addr.clone())).await;
    let n3 = start(dirs[2].path(), Some(n1.addr.clone())).await;
    n2.meta.ready(READY).await.expect("node 2 ready");
    n3.meta.ready(READY).await.expect("node 3 ready");
    let nodes = vec![n1, n2, n3];
    three_voters(&nodes.iter().collect::<Vec<_>>()).await;
    nodes
}

/// Wait until every node of `nodes` sees voters 1, 2 and 3: a joiner is ready as a
/// learner, and the leader's vote keeper promotes it once it has caught up.
async fn three_voters(nodes: &[&Node]) {
    wait_until(Duration::from_secs(10), "3 voters everywhere", || {
        nodes
            .iter()
            .all(|n| ids(&n.meta.status().voters) == vec![1, 2, 3])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_cluster_forms_forwards_writes_and_survives_full_restart() {
    init_tracing();
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = three(&dirs).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    assert_eq!(
        nodes.iter().map(Node::id).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let leader = agreed_leader(&refs).await;
    wait_until(Duration::from_secs(5), "3 voters everywhere", || {
        refs.iter()
            .all(|n| ids(&n.meta.status().voters) == vec![1, 2, 3])
    })
    .await;
    wait_until(Duration::from_secs(5), "3 nodes in every map", || {
        all(&refs, |s| {
            s.map.nodes.len() == 3 && s.map.up_nodes().count() == 3
        })
    })
    .await;

    // A write through a follower is forwarded to the leader and seen everywhere.
    let follower = nodes.iter().find(|n| n.id() != leader).unwrap();
    let mut watch = nodes
        .iter()
        .find(|n| n.id() != follower.id())
        .unwrap()
        .meta
        .watch();
    let reply = follower
        .meta
        .execute(create("disk1", Some(3)))
        .await
        .expect("create via follower");
    let Reply::Vdi(vdi) = reply else {
        panic!("unexpected reply {reply:?}")
    };
    assert_eq!((vdi.id.0, vdi.copies, vdi.size), (1, 3, 1 << 30));
    // execute returns after the local apply: the follower's own state has it now.
    assert!(follower.meta.state().vdis.contains_key("disk1"));
    tokio::time::timeout(
        Duration::from_secs(5),
        watch.wait_for(|s| s.vdis.contains_key("disk1")),
    )
    .await
    .expect("watch saw the VDI in time")
    .expect("watch open");
    wait_until(Duration::from_secs(5), "disk1 on all nodes", || {
        all(&refs, |s| s.vdis.get("disk1") == Some(&vdi))
    })
    .await;

    // State machine errors travel back through forwarding unchanged.
    let err = follower
        .meta
        .execute(create("disk1", None))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
    assert_eq!(err.message(), "VDI 'disk1' already exists");
    let err = follower
        .meta
        .execute(create("big", Some(4)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert_eq!(
        err.message(),
        "copies=4 needs at least 4 nodes, the cluster has 3"
    );

    // A fourth node, joining through a follower, stays a learner (max_voters = 3).
    let n4 = start(dirs[3].path(), Some(follower.addr.clone())).await;
    n4.meta.ready(READY).await.expect("node 4 ready");
    assert_eq!(n4.id(), 4);
    wait_until(Duration::from_secs(5), "node 4 is a learner", || {
        let st = nodes[0].meta.status();
        ids(&st.voters) == vec![1, 2, 3] && ids(&st.learners) == vec![4]
    })
    .await;
    wait_until(
        Duration::from_secs(5),
        "node 4 has the VDI and 4 nodes",
        || {
            let s = n4.meta.state();
            s.vdis.contains_key("disk1") && s.map.nodes.len() == 4
        },
    )
    .await;
    let epoch_before = nodes[0].meta.state().map.epoch;

    // Stop everything, then bring the three voters back from disk on the same ports,
    // in reverse order, without waiting for each other.
    let mut stopped = Vec::new();
    stopped.push(n4.stop().await);
    for n in nodes {
        stopped.push(n.stop().await);
    }
    // Nodes 3 and 2 first: they hold a quorum and must elect a leader between them
    // while the old leader (1) is still down; then node 1 comes back as a follower.
    let mut back = Vec::new();
    for (addr, dir, join) in stopped[2..].iter().rev() {
        back.push(restart(addr, dir, join.clone()).await);
    }
    let first_two: Vec<&Node> = back.iter().collect();
    agreed_leader_among(&first_two, &[2, 3]).await;
    for n in &back {
        n.meta.ready(READY).await.expect("restarted node ready");
    }
    let (addr, dir, join) = &stopped[1];
    back.push(restart(addr, dir, join.clone()).await);
    back[2]
        .meta
        .ready(READY)
        .await
        .expect("node 1 ready after restart");
    let refs: Vec<&Node> = back.iter().collect();
    let mut back_ids: Vec<u64> = back.iter().map(Node::id).collect();
    back_ids.sort_unstable();
    assert_eq!(back_ids, vec![1, 2, 3], "ids come from disk");
    agreed_leader(&refs).await;
    assert!(all(&refs, |s| s.vdis.get("disk1") == Some(&vdi)));
    assert!(all(&refs, |s| s.map.nodes.len() == 4));
    // Same addresses, zones and states: restarting bumps no epoch.
    assert!(all(&refs, |s| s.map.epoch == epoch_before));

    // The learner comes back as a learner.
    let (addr, dir, join) = &stopped[0];
    let n4 = restart(addr, dir, join.clone()).await;
    n4.meta
        .ready(READY)
        .await
        .expect("node 4 ready after restart");
    assert_eq!(n4.id(), 4);
    let st = back[0].meta.status();
    assert_eq!(
        (ids(&st.voters), ids(&st.learners)),
        (vec![1, 2, 3], vec![4])
    );
    assert!(n4.meta.state().vdis.contains_key("disk1"));
    n4.stop().await;

    // And a new write works after the restart.
    let reply = back[2]
        .meta
        .execute(create("disk2", Some(2)))
        .await
        .expect("write after restart");
    let Reply::Vdi(v2) = reply else {
        panic!("unexpected reply {reply:?}")
    };
    assert_eq!(v2.id.0, 2, "VDI ids continue after a restart");
    wait_until(
        Duration::from_secs(5),
        "disk2 on all restarted nodes",
        || all(&refs, |s| s.vdis.contains_key("disk2")),
    )
    .await;
    for n in back {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_snapshot_joiner_and_write_after_leader_shutdown() {
    init_tracing();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let n1 = start(dirs[0].path(), None).await;
    n1.meta.ready(READY).await.expect("node 1 ready");
    n1.meta.execute(Command::SetDefaultCopies(1)).await.unwrap();
    n1.meta.execute(create("early", None)).await.unwrap();
    // Compact: the entries above leave the log, so joiners must take the snapshot.
    n1.meta.compact().await.expect("compact");
    let n2 = start(dirs[1].path(), Some(n1.addr.clone())).await;
    let n3 = start(dirs[2].path(), Some(n1.addr.clone())).await;
    n2.meta.ready(READY).await.expect("node 2 ready");
    n3.meta.ready(READY).await.expect("node 3 ready");
    let nodes = [n1, n2, n3];
    let refs: Vec<&Node> = nodes.iter().collect();
    assert_eq!(
        refs.iter().map(|n| n.id()).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    three_voters(&refs).await;
    wait_until(
        Duration::from_secs(5),
        "snapshot state on every node",
        || {
            all(&refs, |s| {
                s.vdis.contains_key("early") && s.settings.default_copies == 1
            })
        },
    )
    .await;

    // A follower restarted on a new port, without a join address, finds the leader
    // through the members it knows and gets its new address into Raft and the map.
    let leader = agreed_leader(&refs).await;
    let epoch = nodes[0].meta.state().map.epoch;
    let [a, b, c] = nodes;
    let mut nodes = Vec::new();
    for n in [a, b, c] {
        if n.id() != leader && nodes.iter().all(|m: &Node| m.id() == leader) {
            let moved_id = n.id();
            let (old_addr, dir, _) = n.stop().await;
            let moved = start(&dir, None).await;
            assert_ne!(moved.addr, old_addr);
            assert_eq!(moved.id(), moved_id);
            moved.meta.ready(READY).await.expect("moved node ready");
            nodes.push(moved);
        } else {
            nodes.push(n);
        }
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    let moved = nodes
        .iter()
        .find(|n| n.join.is_none() && n.id() != 1)
        .unwrap();
    wait_until(Duration::from_secs(5), "new address in every map", || {
        all(&refs, |s| {
            s.map.nodes[&moved.meta.node_id()].admin_addr == moved.addr
        })
    })
    .await;
    assert!(
        all(&refs, |s| s.map.epoch == epoch),
        "an address change bumps no epoch"
    );
    let leader_node = nodes.iter().find(|n| n.id() == leader).unwrap();
    assert_eq!(ids(&leader_node.meta.status().voters), vec![1, 2, 3]);
    leader_node
        .meta
        .execute(create("moved", None))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(5),
        "the moved node gets new entries",
        || moved.meta.state().vdis.contains_key("moved"),
    )
    .await;

    // Shut the leader down; a write through another node succeeds after re-election.
    let leader = agreed_leader(&refs).await;
    let mut rest = Vec::new();
    let mut old = None;
    for n in nodes {
        if n.id() == leader {
            old = Some(n);
        } else {
            rest.push(n);
        }
    }
    let old = old.unwrap();
    old.stop().await;
    let reply = rest[0]
        .meta
        .execute(create("after", Some(2)))
        .await
        .expect("write after leader loss");
    assert!(matches!(reply, Reply::Vdi(ref v) if v.name == "after"));
    let refs: Vec<&Node> = rest.iter().collect();
    let new_leader = agreed_leader(&refs).await;
    assert_ne!(new_leader, leader);
    wait_until(Duration::from_secs(5), "write on both survivors", || {
        all(&refs, |s| s.vdis.contains_key("after"))
    })
    .await;

    // Stop the follower: the remaining leader has no quorum, its proposal cannot
    // commit, and the write fails at the deadline instead of hanging, as an unknown
    // outcome (the proposal is in the leader's log and may commit later), not as
    // "unavailable" (which says it surely did not happen).
    let follower_at = rest.iter().position(|n| n.id() != new_leader).unwrap();
    rest.remove(follower_at).stop().await;
    let last = rest.pop().unwrap();
    assert_eq!(last.id(), new_leader);
    let err = last
        .meta
        .execute(create("never", Some(1)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(err.message().starts_with("No metadata leader"), "{err}");
    assert!(!last.meta.state().vdis.contains_key("never"));
    last.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_single_node_status_and_shutdown() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let n1 = start(dir.path(), None).await;
    n1.meta.ready(READY).await.unwrap();
    let status = n1.meta.status();
    assert_eq!(status.leader, Some(NodeId(1)));
    assert_eq!(ids(&status.voters), vec![1]);
    assert!(status.last_applied_index.is_some());
    n1.meta.shutdown().await;
    let err = n1
        .meta
        .execute(Command::SetDefaultCopies(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(n1.meta.state().settings.default_copies, 3);
    n1.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_concurrent_commands_share_log_entries() {
    init_tracing();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = three(&dirs).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let leader = agreed_leader(&refs).await;
    let metrics: Vec<_> = nodes
        .iter()
        .map(|n| {
            let m = drove_metrics::Metrics::new();
            n.meta.set_metrics(m.clone());
            m
        })
        .collect();
    let before = nodes[0].meta.status().last_applied_index.unwrap_or(0);
    // 200 creates at once, through every node (two thirds of them forwarded).
    let n = 200;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let meta = nodes[i % 3].meta.clone();
            tokio::spawn(async move { meta.execute(create(&format!("d{i}"), None)).await })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        match t.await.unwrap().expect("create") {
            Reply::Vdi(v) => assert!(ids.insert(v.id.0), "VDI id {} twice", v.id.0),
            other => panic!("unexpected reply {other:?}"),
        }
    }
    assert_eq!(ids.len(), n);
    let state = nodes[0].meta.state();
    assert!((0..n).all(|i| state.vdis.contains_key(&format!("d{i}"))));
    // Each command alone would take an entry (and an fsync) of its own.
    let entries = nodes[0].meta.status().last_applied_index.unwrap_or(0) - before;
    println!("{n} commands in {entries} log entries");
    assert!(
        entries < n as u64 / 2,
        "{n} commands took {entries} entries"
    );
    // The leader counted them, with the entries that carried them.
    let at = nodes.iter().position(|x| x.id() == leader).unwrap();
    nodes[at].meta.publish_metrics();
    let text = metrics[at].encode();
    let value = |line_start: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        value("drove_meta_commands_total{kind=\"CreateVdi\",outcome=\"ok\"}"),
        n as f64
    );
    assert!(value("drove_meta_entry_commands_sum") >= n as f64);
    assert!(value("drove_meta_entry_commands_count") < n as f64 / 2.0);
    assert!(value("drove_meta_commit_seconds_count") >= 1.0);
    assert_eq!(value("drove_meta_leader"), leader as f64);
    assert_eq!(value("drove_meta_quorum"), 1.0);
    // The followers sent theirs to the leader many to a request.
    for (i, m) in metrics.iter().enumerate().filter(|(i, _)| *i != at) {
        nodes[i].meta.publish_metrics();
        let text = m.encode();
        let value = |name: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        let (commands, requests) = (
            value("drove_meta_forward_commands_sum"),
            value("drove_meta_forward_commands_count"),
        );
        println!("node {i}: {commands} commands forwarded in {requests} requests");
        assert!(commands >= 60.0, "node {i} forwarded {commands}");
        assert!(
            requests < commands / 2.0,
            "{commands} commands in {requests} requests"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_read_barrier_and_a_command_without_quorum_applied_once_on_retry() {
    init_tracing();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes = three(&dirs).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let leader = agreed_leader(&refs).await;
    let (mut lead, mut others): (Vec<Node>, Vec<Node>) =
        nodes.into_iter().partition(|n| n.id() == leader);
    let lead = lead.pop().unwrap();
    // A follower that passed the barrier has applied what was committed before it.
    for i in 0..20 {
        lead.meta
            .execute(create(&format!("r{i}"), None))
            .await
            .unwrap();
        others[0]
            .meta
            .read_barrier(Duration::from_secs(5))
            .await
            .expect("read barrier");
        assert!(others[0].meta.state().vdis.contains_key(&format!("r{i}")));
    }

    // Without a majority: the barrier fails in its time; a command the leader proposed
    // but cannot commit has an unknown outcome (not "unavailable": it may still apply).
    let mut stopped = Vec::new();
    for n in others.drain(..) {
        stopped.push(n.stop().await);
    }
    let t = std::time::Instant::now();
    let e = lead
        .meta
        .read_barrier(Duration::from_secs(2))
        .await
        .expect_err("no majority to confirm the leader");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    let id = drove_meta::ClientRequestId { client: 42, seq: 7 };
    let e = drove_meta::with_client_request(id, lead.meta.execute(create("once", None)))
        .await
        .expect_err("no majority");
    assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e}");
    // The majority back: the same request (same id), sent twice more, answers with
    // one VDI; the entry proposed during the outage and the retries apply once.
    for (addr, dir, _) in stopped {
        others.push(restart(&addr, &dir, None).await);
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        let r = drove_meta::with_client_request(id, lead.meta.execute(create("once", None)))
            .await
            .expect("the retry answers");
        match r {
            Reply::Vdi(v) => got.push(v.id),
            other => panic!("unexpected reply {other:?}"),
        }
    }
    assert_eq!(got[0], got[1]);
    // A new request is a new command: the name is taken.
    let e = lead
        .meta
        .execute(create("once", None))
        .await
        .expect_err("exists");
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
}
