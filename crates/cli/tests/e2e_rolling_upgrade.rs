//! A rolling upgrade from the last release to this build, under load (issue 44,
//! item 4). A three-node cluster of the last release's binary (`DROVE_OLD_BIN`,
//! built from 5def163 by scripts/rolling-upgrade.sh) is upgraded one node at a time
//! as an operator would: SIGTERM, start this build on the same data directory and
//! ports, wait for every node to be up, next node. While each node restarts, fio
//! writes 4 KiB blocks with a FLUSH after each through another node and verifies
//! every block afterwards. Then `vdi check` must find every copy identical, every
//! node must report this build's feature level, features of the new level must be
//! refused until `cluster upgrade finish` and accepted after.
//!
//! fio's NBD engine (libnbd) does not reconnect, so the fio run of each step goes
//! through a node other than the one restarting: the stall each restart causes is
//! fio's longest write (clat max), printed per step.
//!
//! Not in `make test` (the old build takes minutes to compile): run
//! `scripts/rolling-upgrade.sh`, which keeps its output in bench/results/.
mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", text(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

#[test]
#[ignore = "needs the last release's binary in DROVE_OLD_BIN: scripts/rolling-upgrade.sh"]
fn test_a_rolling_upgrade_from_the_last_release_under_fio_verify() {
    let old = std::env::var("DROVE_OLD_BIN")
        .expect("DROVE_OLD_BIN: the last release's drove binary (scripts/rolling-upgrade.sh)");
    if !require(&["fio", "qemu-io"]) {
        return;
    }
    let o = run(Command::new(&old).arg("--version"));
    eprintln!("old build: {}", text(&o).trim());

    // The last release's cluster, started by its own `drove up`.
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(&old).args([
        "up",
        "--nodes",
        "3",
        "--zones",
        "3",
        "--dir",
        dir.path().to_str().unwrap(),
        "--detach",
        "--base-port",
        "0",
        "--no-tls",
        "--no-auth",
    ]));
    assert!(o.status.success(), "old drove up: {}", text(&o));
    let mut c = Cluster::adopt_dir(dir);
    // This build's CLI drives the old nodes, as after a package upgrade.
    c.create_vdi("load", "64M", &[]);
    // The old nodes have no upgrade routes: this CLI says what that means.
    let o = c.drove(0, &["cluster", "upgrade", "status"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("from before cluster feature levels"),
        "{}",
        text(&o)
    );

    // Node 3, node 2, node 1, each while fio writes through another node.
    let mut stalls = Vec::new();
    for i in [2usize, 1, 0] {
        let via = if i == 0 { 1 } else { 0 };
        let load = paced_fio(&format!("step{}", i + 1), &c.nodes[via].uri("load"), 1)
            .arg("--io_size=24M")
            .spawn()
            .unwrap();
        c.stop(i);
        c.restart(i);
        wait_for(Duration::from_secs(60), "every node up", || {
            let s = json(&c.drove(via, &["node", "list", "--json"]));
            let up = s["nodes"]
                .as_object()
                .map(|m| m.values().filter(|n| n["state"] == "up").count())
                .unwrap_or(0);
            if up == 3 {
                Ok(())
            } else {
                Err(s.to_string())
            }
        });
        let mut load = load;
        assert!(
            load.try_wait().unwrap().is_none(),
            "fio ended before node {} was back: the step did not run under load",
            i + 1
        );
        let j = fio_ok(load, &format!("node {} restarted", i + 1));
        // The longest write or FLUSH (fio takes one after each write).
        let job = &j["jobs"][0];
        let max_ms = job["write"]["clat_ns"]["max"]
            .as_f64()
            .unwrap()
            .max(job["sync"]["lat_ns"]["max"].as_f64().unwrap_or(0.0))
            / 1e6;
        let ios = job["write"]["total_ios"].as_u64().unwrap();
        eprintln!(
            "node {} restarted as this build: fio through node {}: {ios} writes verified, \
             longest write or FLUSH {max_ms:.1} ms",
            i + 1,
            via + 1
        );
        stalls.push((i + 1, max_ms));
    }

    // Every copy identical after three restarts under writes.
    let r = json(&c.drove(0, &["vdi", "check", "load", "--json"]));
    assert_eq!(r["identical"], r["objects"], "{r}");
    assert_eq!(r["degraded"], 0, "{r}");

    // Every node runs this build; the cluster is still at the old level, so the
    // new level's features are refused until the operator finishes the upgrade.
    // Each node's record says this build's level: records the old members
    // applied without the new fields are written again (see the daemon's
    // upgrade::record_again).
    let s = wait_for(
        Duration::from_secs(30),
        "every node at this build's level",
        || {
            let s = json(&c.drove(0, &["cluster", "upgrade", "status", "--json"]));
            let all = s["nodes"].as_array().is_some_and(|n| {
                n.len() == 3 && n.iter().all(|n| n["features"] == s["this_build"])
            });
            if all {
                Ok(s)
            } else {
                Err(s.to_string())
            }
        },
    );
    eprintln!("after the restarts: {s}");
    let o = c.drove(0, &["vdi", "set", "load", "--iops-limit", "1000"]);
    assert!(!o.status.success(), "limits before finish: {}", text(&o));
    assert!(text(&o).contains("upgrade finish"), "{}", text(&o));
    let o = c.drove(0, &["cluster", "upgrade", "finish"]);
    assert!(o.status.success(), "finish: {}", text(&o));
    eprintln!("{}", text(&o).trim());
    let o = c.drove(0, &["vdi", "set", "load", "--iops-limit", "1000"]);
    assert!(o.status.success(), "limits after finish: {}", text(&o));
    qemu_io(&c.nodes[2].uri("load"), &["read 0 4M".into()]);

    eprintln!("longest write or FLUSH per restart (node, ms): {stalls:?}");
}
