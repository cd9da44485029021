//! Two datacenters and a witness, with real node processes on 127.0.0.1:
//! - two zones of two nodes without a witness: `cluster health` warns that the
//!   loss of the zone with two of the three voters would stop the metadata;
//! - `drove up --nodes 4 --zones 2 --witness`: the voters are the witness and one
//!   node per datacenter, `node list` says which node is the witness, and health
//!   has no zone-loss warning;
//! - the witness holds no object after writes with 3 copies, binds no NBD socket,
//!   and an NBD command aimed at it fails saying it is a witness;
//! - SIGKILL of both nodes of the datacenter holding the metadata leader (the other
//!   one if the witness leads), while a VDI homed in the surviving datacenter is
//!   written through a node there with 4 KiB FUA writes: no write fails (the
//!   longest pause is printed), and the metadata still takes changes (a VDI is
//!   created) with the witness and the survivors' voter.
mod common;
use common::fua::*;
use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

/// `cluster health --json` asked of node `i` (its exit status says the level).
fn health(c: &Cluster, i: usize) -> Value {
    let o = c.drove(i, &["cluster", "health", "--json"]);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

/// The messages of the `voters` checks of a health answer, with their levels.
fn voter_checks(h: &Value) -> Vec<(String, String)> {
    h["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "voters")
        .map(|c| {
            (
                c["level"].as_str().unwrap().to_string(),
                c["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn test_two_datacenters_without_a_witness_warn_that_one_of_them_holds_the_majority() {
    let c = Cluster::start(4, 2);
    let s = c.status();
    let voters = ids(&s["voters"]);
    assert_eq!(voters.len(), 3, "{s}");
    // Two zones, three voters: one zone holds two of them.
    let mut per_zone = std::collections::BTreeMap::<String, usize>::new();
    for v in &voters {
        *per_zone
            .entry(c.nodes[index(&c, *v)].zone.clone())
            .or_default() += 1;
    }
    let (crowded, _) = per_zone.iter().find(|(_, n)| **n == 2).unwrap();
    let h = health(&c, 0);
    assert_eq!(h["status"], "warn", "{h}");
    let said = voter_checks(&h);
    let want = format!("losing zone {crowded} would stop the metadata: it holds 2 of 3 voters");
    assert!(
        said.iter()
            .any(|(l, m)| l == "warn" && m.starts_with(&want) && m.contains("add a witness")),
        "no `{want}` warning in {h}"
    );
}

#[test]
fn test_a_witness_lets_either_datacenter_be_lost_and_holds_no_data() {
    if !have_libnbd() {
        return;
    }
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 4, 2, &["--witness"]);
    assert_eq!(c.nodes.len(), 5);
    let w = 4;
    assert!(
        c.nodes[w].witness && c.nodes[w].zone == "z3",
        "{:?}",
        c.nodes[w]
    );
    assert!(c.nodes[..4].iter().all(|n| !n.witness));
    let witness = c.nodes[w].id;
    // `drove up` returns once the voters are placed: the witness and one per
    // datacenter.
    let s = c.status();
    let voters = ids(&s["voters"]);
    let mut zones: Vec<&str> = voters
        .iter()
        .map(|v| c.nodes[index(&c, *v)].zone.as_str())
        .collect();
    zones.sort();
    assert_eq!(zones, ["z1", "z2", "z3"], "voters {voters:?}: {s}");
    assert!(voters.contains(&witness), "{s}");
    let list = json_of(&c, 0, &["node", "list", "--json"]);
    let wn = &list["nodes"][witness.to_string()];
    assert_eq!(wn["witness"], true, "{list}");
    assert_eq!(wn["weight"], 0, "{list}");
    assert_eq!(wn["nbd_addr"], "", "{list}");
    for n in &c.nodes[..4] {
        assert!(
            list["nodes"][n.id.to_string()].get("witness").is_none(),
            "{list}"
        );
    }
    let o = c.drove(0, &["node", "list"]);
    let table = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        table.lines().any(|l| l.starts_with(&format!("{witness} "))
            && l.contains("z3")
            && (l.contains("voter, witness") || l.contains("leader, witness"))),
        "{table}"
    );
    // No zone-loss warning: any one zone may go (asked of the witness, which
    // survives whichever datacenter is lost).
    // Right after `drove up` a node may not have heard every heartbeat yet: wait
    // for OK (but a warning about the machine's own nearly full disk), and say
    // what was not.
    let h = wait_for(Duration::from_secs(30), "health OK after start", || {
        let h = health(&c, w);
        if findings_but_disk_warnings(&h).is_empty() {
            Ok(h)
        } else {
            Err(h.to_string())
        }
    });
    let said = voter_checks(&h);
    assert_eq!(said.len(), 1, "{h}");
    assert_eq!(said[0].0, "ok", "{h}");
    assert!(
        said[0]
            .1
            .ends_with("the loss of any one zone keeps a majority"),
        "{h}"
    );
    // The witness binds no NBD socket, and NBD commands aimed at it say why not.
    let wdata = std::path::PathBuf::from(&c.nodes[w].data);
    assert!(!wdata.join("nbd.sock").exists());
    let img = c.dir.path().join("img");
    std::fs::write(&img, vec![7u8; 1 << 20]).unwrap();
    let o = c.drove(w, &["vdi", "import", img.to_str().unwrap(), "imp"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("Node {witness} is a witness")),
        "{}",
        text(&o)
    );

    // The datacenter to lose: the leader's, or z1 when the witness leads.
    let leader = s["leader"].as_u64().unwrap();
    let lost = if leader == witness {
        "z1".to_string()
    } else {
        c.nodes[index(&c, leader)].zone.clone()
    };
    let kept: Vec<usize> = (0..4).filter(|&i| c.nodes[i].zone != lost).collect();
    let doomed: Vec<usize> = (0..4).filter(|&i| c.nodes[i].zone == lost).collect();
    let home = c.nodes[kept[0]].zone.clone();
    let o = c.drove(kept[0], &["cluster", "config", "--down-after", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    c.create_vdi(
        "far",
        "64M",
        &[
            "--copies",
            "3",
            "--policy",
            "zone-sync",
            "--home-zone",
            &home,
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let writing = writer(&c.nodes[kept[0]].uri("far"), 60, &stop);
    // Three copies on four data nodes: none on the witness.
    wait_for(
        Duration::from_secs(30),
        "the writer's first objects",
        || match object_files(c.nodes[kept[0]].data.as_ref()) {
            0 => Err("no object file yet".to_string()),
            _ => Ok(()),
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(object_files(&wdata), 0, "the witness holds objects");
    let killed_at = unix_now();
    for &i in &doomed {
        c.kill(i);
    }
    let survivor = kept[1];
    wait_for(
        Duration::from_secs(60),
        "the lost datacenter's nodes marked down",
        || {
            let s = json_of(&c, survivor, &["cluster", "status", "--json"]);
            let down = doomed
                .iter()
                .all(|&i| s["map"]["nodes"][c.nodes[i].id.to_string()]["state"] == "down");
            if down {
                Ok(())
            } else {
                Err(s.to_string())
            }
        },
    );
    let marked_at = unix_now();
    // The metadata still commits: the witness and the survivors' voter are a majority.
    let o = c.drove(
        survivor,
        &["vdi", "create", "after", "16M", "--copies", "2"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let created_at = unix_now();
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&stop, b"").unwrap();
    let sum = summary(writing);
    let pause = longest_pause(&sum, killed_at);
    eprintln!(
        "zone {lost} (leader node {leader}, witness node {witness}) lost: {} writes through \
         node {} in zone {home}, longest pause after the kill {pause:.2} s, error {}; marked \
         down {:.1} s after the kill, a VDI created {:.1} s after that",
        sum["writes"],
        c.nodes[kept[0]].id,
        sum["error"],
        marked_at - killed_at,
        created_at - marked_at,
    );
    assert!(sum["error"].is_null(), "a write failed: {sum}");
    assert!(
        sum["last"].as_f64().unwrap() > marked_at,
        "writes did not go on after the loss: {sum}"
    );
    // Writes through the surviving datacenter never wait for the lost one (the
    // pause is printed above, typically under a second); the bound is loose so that
    // a busy machine does not fail it, while a write path that waited for the dead
    // nodes' timeouts and the leader's election in turn would still.
    assert!(pause < 20.0, "writes paused {pause:.1} s: {sum}");
    assert_eq!(object_files(&wdata), 0, "the witness holds objects");
    let s = json_of(&c, survivor, &["cluster", "status", "--json"]);
    assert!(ids(&s["voters"]).contains(&witness), "{s}");
}

#[test]
fn test_witness_refuses_the_flags_of_a_data_node_on_the_command_line_and_in_a_config() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    for flag in [
        &["--weight", "5"][..],
        &["--nbd-listen", "127.0.0.1:10809"],
        &["--nbd-tls", "off"],
        &["--nbd-socket-group", "0"],
    ] {
        let o = run(Command::new(drove_bin())
            .args(["node", "run", "--witness", "--data", data])
            .args(flag));
        assert_eq!(o.status.code(), Some(2), "{flag:?}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("'--witness' cannot be used with '{}", flag[0])),
            "{flag:?}: {}",
            text(&o)
        );
    }
    // A config file's keys come one by one: the node checks them itself, before it
    // touches the data directory.
    let conf = dir.path().join("node.toml");
    std::fs::write(
        &conf,
        format!("data = \"{data}\"\nwitness = true\nnbd_listen = \"127.0.0.1:10809\"\n"),
    )
    .unwrap();
    let o =
        run(Command::new(drove_bin()).args(["node", "run", "--config", conf.to_str().unwrap()]));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("--witness serves no NBD: --nbd-listen makes no sense with it"),
        "{}",
        text(&o)
    );
    assert!(
        !std::path::Path::new(data).exists(),
        "the data directory was made"
    );
}

/// `drove node run` for node `i` of `c` on its own directory, ports and
/// credentials, with `extra` arguments (a witness is started with `--witness`).
fn node_run(c: &Cluster, i: usize, extra: &[&str]) -> std::process::Child {
    let n = &c.nodes[i];
    let mut cmd = Command::new(drove_bin());
    cmd.args(["node", "run", "--data", &n.data, "--zone", &n.zone])
        .args(["--listen", &n.admin, "--peer-listen", &n.peer])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(t) = &n.tls_dir {
        cmd.args(["--tls-dir", t]);
    }
    if let Some(t) = &n.admin_token_file {
        cmd.args(["--admin-token-file", t]);
    }
    cmd.spawn().unwrap()
}

/// Wait until `witness` is out of the map and three data nodes vote.
fn voters_placed_without(c: &Cluster, witness: u64) {
    wait_until(
        Duration::from_secs(60),
        "the voters placed on the data nodes",
        || {
            let s = c.status();
            let v = ids(&s["voters"]);
            v.len() == 3 && !v.contains(&witness)
        },
    );
    let s = c.status();
    assert!(s["map"]["nodes"].get(witness.to_string()).is_none(), "{s}");
}

/// The witness of a 2 x 2 cluster is taken out: its directory refuses to come back
/// as a data node, `node remove` forgets it while it is down, and the voters are
/// placed again on the data nodes (health then warns that one datacenter holds
/// the majority).
#[test]
fn test_a_witness_cannot_come_back_as_a_data_node_and_is_removed_cleanly() {
    let mut c = Cluster::start_with(tempfile::tempdir().unwrap(), 4, 2, &["--witness"]);
    let w = 4;
    let witness = c.nodes[w].id;
    c.kill(w);
    // Started again without --witness: refused before it joins, naming the role.
    let mut child = node_run(&c, w, &["--nbd-listen", "127.0.0.1:0"]);
    let mut status = None;
    wait_until(Duration::from_secs(60), "the refused node to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let out = child.wait_with_output().unwrap();
    assert!(!status.unwrap().success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("belongs to a witness") && err.contains("--witness"),
        "{err}"
    );
    let list = json_of(&c, 0, &["node", "list", "--json"]);
    let wn = &list["nodes"][witness.to_string()];
    assert_eq!(wn["witness"], true, "{list}");
    assert_eq!(wn["nbd_addr"], "", "{list}");
    assert_eq!(wn["weight"], 0, "{list}");
    // With --witness it comes back.
    let child = node_run(&c, w, &["--witness"]);
    c.adopt(w, child);
    wait_until(
        Duration::from_secs(60),
        "the witness to serve again",
        || c.drove(w, &["cluster", "status"]).status.success(),
    );
    let o = c.drove(0, &["cluster", "config", "--down-after", "3"]);
    assert!(o.status.success(), "{}", text(&o));
    c.kill(w);
    // `node remove` is for a node that is down.
    wait_until(Duration::from_secs(60), "the witness marked down", || {
        c.status()["map"]["nodes"][witness.to_string()]["state"] == "down"
    });
    let o = c.drove(0, &["node", "remove", &witness.to_string()]);
    assert!(o.status.success(), "{}", text(&o));
    voters_placed_without(&c, witness);
    let h = health(&c, 0);
    assert!(
        voter_checks(&h)
            .iter()
            .any(|(l, m)| l == "warn" && m.contains("add a witness")),
        "{h}"
    );
    // The metadata still takes changes.
    let o = c.drove(1, &["vdi", "create", "after", "16M", "--copies", "2"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A running witness leaves with `node leave`: nothing to drain, its process stops,
/// and the voters are placed again on the data nodes.
#[test]
fn test_a_running_witness_leaves_and_stops() {
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 4, 2, &["--witness"]);
    let w = 4;
    let witness = c.nodes[w].id;
    let o = c.drove(0, &["node", "leave", &witness.to_string()]);
    assert!(o.status.success(), "{}", text(&o));
    let said = text(&o);
    assert!(
        said.contains("witness") && said.contains("holds no objects"),
        "{said}"
    );
    let pid = c.nodes[w].pid;
    wait_until(
        Duration::from_secs(30),
        "the witness's process to stop",
        || {
            reap(pid);
            !exists(pid)
        },
    );
    voters_placed_without(&c, witness);
    let o = c.drove(1, &["vdi", "create", "after", "16M", "--copies", "2"]);
    assert!(o.status.success(), "{}", text(&o));
}
