//! Mixed wire versions with real node processes: a node that speaks drove wire
//! version 4 only (`DROVE_TEST_WIRE_RANGE=4-4`, as the last release 5def163 did)
//! serves beside nodes of this build's 4-5, and nodes that share no version refuse
//! each other with a message naming both ranges. A real 5def163 binary is not built
//! here (make test builds no old commits): node 3 is this build narrowed to 4-4.
mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const RANGE_ENV: &str = "DROVE_TEST_WIRE_RANGE";

fn log_of(c: &Cluster, i: usize) -> String {
    std::fs::read_to_string(Path::new(&c.nodes[i].data).join("node.log")).unwrap_or_default()
}

/// The value of `drove_peer_wire_version{peer="P"}` in node `i`'s metrics.
fn wire_version(c: &Cluster, i: usize, peer: u64) -> Option<u64> {
    let want = format!("drove_peer_wire_version{{peer=\"{peer}\"}} ");
    c.metrics(i)
        .lines()
        .find_map(|l| l.strip_prefix(&want)?.trim().parse().ok())
}

/// Wait until node `i`'s log holds `needle`; on time-out, panic with the lines of
/// every node's log that speak of peer connections.
fn wait_for_log(c: &Cluster, i: usize, needle: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !log_of(c, i).contains(needle) {
        if std::time::Instant::now() > end {
            let lines: Vec<String> = (0..c.nodes.len())
                .flat_map(|n| {
                    log_of(c, n)
                        .lines()
                        .filter(|l| l.contains("peer") || l.contains("wire"))
                        .map(|l| format!("node {}: {l}", n + 1))
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!(
                "node {} never logged {needle:?}; the peer lines:\n{}",
                i + 1,
                lines.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn all_up(c: &Cluster) -> bool {
    let s = c.status();
    c.nodes
        .iter()
        .all(|n| s["map"]["nodes"][n.id.to_string()]["state"] == "up")
}

/// Node 3 restarted speaking version 4 only: a VDI of three copies written through
/// each node reads back through each, `vdi check` finds its copies identical, and
/// every node's metrics show the version it talks to each peer (4 with node 3, 5
/// between nodes 1 and 2); nodes 1 and 2 log that they talk version 4 to node 3.
#[test]
fn test_a_node_of_wire_version_4_serves_beside_nodes_of_4_to_5() {
    if !require(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(3, 3);
    c.kill(2);
    c.restart_env(2, &[], &[(RANGE_ENV, "4-4")]);
    wait_until(Duration::from_secs(60), "every node up", || all_up(&c));
    let old = log_of(&c, 2);
    assert!(
        old.contains("this node speaks drove wire versions 4-4 only (a test hook)"),
        "node 3's log:\n{old}"
    );
    c.create_vdi("mixed", "64M", &["--copies", "3"]);
    // A pattern per node, each across an object boundary (4 MiB objects).
    let spots = [(0x41, 4 << 20), (0x42, (12 << 20) - 2048), (0x43, 40 << 20)];
    for (i, (p, off)) in spots.iter().enumerate() {
        let cmds = [format!("write -P {p} {off} 8192"), "flush".to_string()];
        qemu_io(&c.nodes[i].uri("mixed"), &cmds);
    }
    let reads: Vec<String> = spots
        .iter()
        .map(|(p, off)| format!("read -P {p} {off} 8192"))
        .collect();
    for n in &c.nodes {
        qemu_io(&n.uri("mixed"), &reads);
    }
    let o = c.drove(1, &["vdi", "check", "mixed", "--json"]);
    assert!(o.status.success(), "vdi check: {}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["objects"].as_u64() >= Some(3), "{v}");
    assert_eq!(v["identical"], v["objects"], "{v}");
    assert_eq!(v["degraded"], 0, "{v}");
    // Writes through nodes 1 and 2 went to node 3 and between themselves, and
    // node 3's writes to both: each of those pairs has a connection.
    for (i, peer, want) in [
        (0, 3, 4),
        (1, 3, 4),
        (0, 2, 5),
        (1, 1, 5),
        (2, 1, 4),
        (2, 2, 4),
    ] {
        assert_eq!(
            wire_version(&c, i, peer),
            Some(want),
            "node {} to node {peer}:\n{}",
            i + 1,
            c.metrics(i)
        );
    }
    for i in [0, 1] {
        let log = log_of(&c, i);
        let want = "peer connection in drove wire version 4, the highest node 3 and this node (versions 4-5) both speak";
        assert!(log.contains(want), "node {}'s log:\n{log}", i + 1);
    }
}

/// Nodes 1 and 2 speak version 5 only, node 3 version 4 only: no version in
/// common. A write through node 1 reaches node 3's port and is refused (node 1's
/// gateway marks node 3 down); both sides log the refusal naming both ranges, and
/// node 3's own dials are refused by nodes 1 and 2 the same way.
#[test]
fn test_nodes_that_share_no_wire_version_refuse_each_other_naming_both_ranges() {
    if !require(&["qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_cmd(dir, 3, 3, &[], |up| {
        up.env(RANGE_ENV, "5-5");
    });
    c.kill(2);
    c.restart_env(2, &[], &[(RANGE_ENV, "4-4")]);
    c.create_vdi("apart", "64M", &["--copies", "3"]);
    // Whatever becomes of the write (node 3 marked down, the write on two
    // copies), node 1 dialled node 3 for it.
    let _ = try_qemu_io(
        &c.nodes[0].uri("apart"),
        &["write -P 7 0 4096".to_string(), "flush".to_string()],
    );
    // Node 3 refuses node 1's hello; node 1 logs the refusal it was answered.
    let server = "this node speaks drove wire versions 4-4, node 1 speaks 5-5";
    wait_for_log(
        &c,
        2,
        &format!("refused a peer connection: refused node 1: {server}"),
    );
    let client = log_of(&c, 0);
    assert!(
        client.contains(&format!(
            "peer connection refused: Node 3 at {} refused us: {server}",
            c.nodes[2].peer
        )),
        "node 1's log:\n{client}"
    );
    // Its gateway gave up on node 3 for the write, naming why.
    assert!(
        client.contains("marking node down by gateway node 1: node 3"),
        "node 1's log:\n{client}"
    );
    // Node 3's own dials (its catch-up asks its peers what they hold) are
    // refused by nodes 1 and 2 the other way round.
    for i in [0, 1] {
        let want = "refused a peer connection: refused node 3: this node speaks drove wire versions 5-5, node 3 speaks 4-4";
        wait_for_log(&c, i, want);
    }
}

const LEVEL_ENV: &str = "DROVE_TEST_FEATURE_LEVEL";

/// This build's feature level, which `upgrade finish` raises the cluster to.
const LEVEL: u32 = drove_types::FEATURE_LEVEL;

/// The `upgrade` check of `cluster health --json` asked of node `i`, if any.
fn upgrade_check(c: &Cluster, i: usize) -> Option<String> {
    let o = c.drove(i, &["cluster", "health", "--json"]);
    let h: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    h["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "upgrade")
        .map(|c| c["message"].as_str().unwrap().to_string())
}

/// A rolling upgrade of the cluster feature level with real processes. A cluster
/// whose nodes say they know level 1 only (`DROVE_TEST_FEATURE_LEVEL=1`, as the
/// release before levels) refuses per-VDI I/O limits (level 2). Nodes 1 and 2
/// restarted as this build: health warns the builds are mixed, and `cluster upgrade
/// finish` is refused naming node 3. Node 3 restarted too: health says to finish;
/// `finish` raises the level, the limits are taken, health has nothing more to say,
/// and node 3 started again as a level-1 build is refused, naming both levels.
#[test]
fn test_the_feature_level_rises_only_once_every_node_knows_it() {
    let mut c = Cluster::start_cmd(tempfile::tempdir().unwrap(), 3, 3, &[], |up| {
        up.env(LEVEL_ENV, "1");
    });
    let o = c.drove(
        0,
        &[
            "vdi",
            "create",
            "capped",
            "64M",
            "--write-iops-limit",
            "100",
        ],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(
            "Per-VDI I/O limits need cluster feature level 2, and the cluster is at level 1"
        ),
        "{}",
        text(&o)
    );
    c.create_vdi("plain", "64M", &["--copies", "3"]);
    let o = c.drove(0, &["vdi", "set", "plain", "--write-iops-limit", "100"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(upgrade_check(&c, 0), None);

    for i in [0, 1] {
        c.kill(i);
        c.restart(i);
    }
    wait_until(Duration::from_secs(60), "every node up", || all_up(&c));
    let said = wait_for(Duration::from_secs(30), "the mixed builds said", || {
        let m = upgrade_check(&c, 0).unwrap_or_default();
        match m.contains("node 3 runs drove") && m.contains("nodes 1, 2 run drove") {
            true => Ok(m),
            false => Err(m),
        }
    });
    assert!(said.starts_with("the nodes run different builds"), "{said}");
    let o = c.drove(0, &["cluster", "upgrade", "finish"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "Cannot raise the cluster to feature level {LEVEL}"
        )) && text(&o).contains("3"),
        "{}",
        text(&o)
    );
    // Asked of node 2, whose own view may lag a moment behind node 1's.
    wait_for(Duration::from_secs(30), "node 2 to list the builds", || {
        let o = c.drove(1, &["cluster", "upgrade", "status", "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        let u: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(u["feature_level"], 1, "{u}");
        let knows: Vec<u64> = u["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["features"].as_u64().unwrap())
            .collect();
        match knows == [u64::from(LEVEL), u64::from(LEVEL), 1] {
            true => Ok(()),
            false => Err(u.to_string()),
        }
    });

    c.kill(2);
    c.restart(2);
    wait_until(Duration::from_secs(60), "every node up", || all_up(&c));
    wait_for(Duration::from_secs(30), "health to say finish", || {
        let m = upgrade_check(&c, 2).unwrap_or_default();
        let says = format!("every node knows feature level {LEVEL}, the cluster is at level 1");
        match m.contains(&says) {
            true => Ok(()),
            false => Err(m),
        }
    });
    let o = c.drove(2, &["cluster", "upgrade", "finish"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("Cluster feature level raised from 1 to {LEVEL}")),
        "{}",
        text(&o)
    );
    let o = c.drove(0, &["cluster", "upgrade", "finish"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("already at feature level {LEVEL}")),
        "{}",
        text(&o)
    );
    let o = c.drove(0, &["vdi", "set", "plain", "--write-iops-limit", "100"]);
    assert!(o.status.success(), "{}", text(&o));
    c.create_vdi(
        "capped",
        "64M",
        &["--copies", "3", "--write-iops-limit", "100"],
    );
    assert_eq!(upgrade_check(&c, 0), None);

    // Node 3 goes back to a level-1 build: it may not record itself.
    c.kill(2);
    c.restart_env(2, &[], &[(LEVEL_ENV, "1")]);
    wait_for_log(
        &c,
        2,
        &format!(
            "Node 3 runs a build of cluster feature level 1, and the cluster is at level {LEVEL}"
        ),
    );
}
