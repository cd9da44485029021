//! Cluster identity: every internal call names its cluster, and a node refuses calls
//! from any other (a node left running from a deleted cluster whose ports a new
//! cluster reused once marked healthy nodes down and broke writes).
mod common;

use common::*;
use std::time::Duration;

async fn post(addr: &str, path: &str, cluster: Option<&str>, body: &str) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(5))
        .body(body.to_string());
    if let Some(c) = cluster {
        req = req.header("x-drove-cluster", c);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_calls_from_another_cluster_are_refused_and_change_nothing() {
    init_tracing();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start(da.path(), None).await;
    let b = start(db.path(), None).await;
    a.meta.ready(READY).await.unwrap();
    b.meta.ready(READY).await.unwrap();
    let (ida, idb) = (a.meta.cluster_id(), b.meta.cluster_id());
    assert_ne!(ida, idb, "two bootstraps, two clusters");

    // A joining node learns the id without naming one.
    let hello: serde_json::Value = reqwest::get(format!("http://{}/meta/hello", a.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(hello["cluster"], ida.to_hex());

    // The vote that once poisoned a cluster's term for good, sent by "node 1" of
    // cluster B, and the same with no cluster named: refused, term unchanged.
    let term = a.meta.status().term;
    let vote = r#"{"vote":{"leader_id":{"term":18446744073709551615,"node_id":2},"committed":false},"last_log_id":null}"#;
    for cluster in [Some(idb.to_hex()), None, Some("junk".to_string())] {
        let (status, body) = post(&a.addr, "/raft/vote", cluster.as_deref(), vote).await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains(&ida.to_hex()), "{body}");
    }
    let hb = r#"{"node":1,"healthy":false}"#;
    let (status, _) = post(&a.addr, "/meta/heartbeat", Some(&idb.to_hex()), hb).await;
    assert_eq!(status, 403);
    let (status, _) = post(&a.addr, "/meta/write", None, "{}").await;
    assert_eq!(status, 403);
    assert_eq!(a.meta.status().term, term);
    assert_eq!(a.meta.status().leader, Some(drove_types::NodeId(1)));

    // A node joining A takes A's id, and keeps it across a restart.
    let dc = tempfile::tempdir().unwrap();
    let c = start(dc.path(), Some(a.addr.clone())).await;
    c.meta.ready(READY).await.unwrap();
    assert_eq!(c.meta.cluster_id(), ida);
    let (addr, dir, join) = c.stop().await;
    let c = restart(&addr, &dir, join).await;
    c.meta.ready(READY).await.unwrap();
    assert_eq!(c.meta.cluster_id(), ida);
    c.stop().await;
    a.stop().await;
    b.stop().await;
}

/// A one-node cluster ready to serve: its directory, the node, its cluster id (hex)
/// and the next node id it would hand out.
async fn one_node() -> (tempfile::TempDir, Node, String, u64) {
    init_tracing();
    let da = tempfile::tempdir().unwrap();
    let a = start(da.path(), None).await;
    a.meta.ready(READY).await.unwrap();
    let id = a.meta.cluster_id().to_hex();
    let next = a.meta.state().next_node_id;
    (da, a, id, next)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_batch_of_commands_from_the_network_is_refused() {
    let (_da, a, id, next) = one_node().await;
    // Only the leader's batcher makes batches; from the network, even with the right
    // cluster id, one is refused (a batch could hide commands from the checks on
    // single ones) and nothing of it applies.
    let batch = r#"{"id":{"client":7,"seq":1},"now":0,"cmd":{"Batch":[{"id":{"client":7,"seq":2},"now":0,"cmd":"AllocateNodeId"}]}}"#;
    let (status, body) = post(&a.addr, "/meta/write", Some(&id), batch).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("made by the leader"), "{body}");
    // Nor a history trim: it rests on the heartbeats only the leader has heard.
    let trim = r#"{"id":{"client":7,"seq":4},"now":0,"cmd":{"TrimHistory":{"keep_from":1}}}"#;
    let before = a.meta.state().epoch_history.len();
    let (status, body) = post(&a.addr, "/meta/write", Some(&id), trim).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("made by the leader"), "{body}");
    assert_eq!(a.meta.state().epoch_history.len(), before);
    // Nor a feature level its only member does not know: refused before it is
    // proposed (no log entry), so a member of an older build never meets it.
    let applied = a.meta.status().last_applied_index;
    let level = r#"{"id":{"client":7,"seq":5},"now":0,"cmd":{"FinishUpgrade":{"level":99}}}"#;
    let (status, body) = post(&a.addr, "/meta/write", Some(&id), level).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("Cannot raise the cluster to feature level 99: metadata member(s) 1"),
        "{body}"
    );
    assert_eq!(a.meta.status().last_applied_index, applied);
    let single = r#"{"id":{"client":7,"seq":3},"now":0,"cmd":"AllocateNodeId"}"#;
    let (status, body) = post(&a.addr, "/meta/write", Some(&id), single).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("NodeId"), "{body}");
    wait_until(Duration::from_secs(5), "the single command applied", || {
        a.meta.state().next_node_id == next + 1
    })
    .await;
    a.stop().await;
}

/// `/meta/write-batch` (forwarded commands, many to a request) checks each command as
/// `/meta/write` does, answers each in order, and refuses an empty or too long batch
/// whole; from another cluster it is refused like every internal call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_forwarded_batch_is_checked_command_by_command() {
    let (_da, a, id, next) = one_node().await;
    let one =
        |seq: u64| format!(r#"{{"id":{{"client":9,"seq":{seq}}},"now":0,"cmd":"AllocateNodeId"}}"#);
    let hidden = r#"{"id":{"client":9,"seq":2},"now":0,"cmd":{"ExtendLeases":{"leases":[]}}}"#;
    let body = format!("[{},{hidden},{}]", one(1), one(3));
    let (status, text) = post(&a.addr, "/meta/write-batch", Some(&id), &body).await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let answers = v["Ok"].as_array().unwrap_or_else(|| panic!("{text}"));
    assert_eq!(answers.len(), 3, "{text}");
    assert!(
        answers[0]["Ok"]["result"]["Ok"]["NodeId"].is_u64(),
        "{text}"
    );
    assert!(
        answers[1]["Err"]["msg"]
            .as_str()
            .unwrap()
            .contains("made by the leader"),
        "{text}"
    );
    assert!(
        answers[2]["Ok"]["result"]["Ok"]["NodeId"].is_u64(),
        "{text}"
    );
    wait_until(
        Duration::from_secs(5),
        "both allowed commands applied",
        || a.meta.state().next_node_id == next + 2,
    )
    .await;
    // The same batch again: applied once (request ids), the same answers.
    let (_, again) = post(&a.addr, "/meta/write-batch", Some(&id), &body).await;
    let w: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(
        w["Ok"][0]["Ok"]["result"], v["Ok"][0]["Ok"]["result"],
        "{again}"
    );
    assert_eq!(a.meta.state().next_node_id, next + 2);

    let too_long = format!("[{}]", (10..267).map(one).collect::<Vec<_>>().join(","));
    for bad in ["[]".to_string(), too_long] {
        let (status, text) = post(&a.addr, "/meta/write-batch", Some(&id), &bad).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("A forwarded batch of"), "{text}");
    }
    let (status, _) = post(&a.addr, "/meta/write-batch", Some("junk"), &body).await;
    assert_eq!(status, 403);
    assert_eq!(a.meta.state().next_node_id, next + 2);
    a.stop().await;
}
