//! A rolling upgrade from the last release to this build, under load (issue 44,
//! item 4). A three-node cluster of the last release's binary (`DROVE_OLD_BIN`,
//! built from 5def163 by scripts/rolling-upgrade.sh) is upgraded one node at a time
//! as an operator would: SIGTERM, start this build on the same data directory and
//! ports, wait for every node to be up, next node. While each node restarts, fio
//! writes 4 KiB blocks with a FLUSH after each through another node and verifies
//! every block afterwards, and a VM (TCG, its disk on node 3's unix socket with the
//! documented `reconnect-delay`) writes and verifies a counter and a log of records
//! in a loop the whole time, riding through node 3's own restart. Then the guest's
//! final verify and a read of its disk through node 1 must find every record, `vdi
//! check` must find every copy identical, every
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

use common::guest_loop::*;
use common::vm::{Start, VmKit};
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
    let Some(kit) = require_ok(VmKit::find()) else {
        return;
    };
    if !require(&["fio", "qemu-io", "qemu-img"]) {
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

    // The VM, on node 3, running through every restart.
    c.create_vdi("vm", "32M", &[]);
    let tmp = tempfile::tempdir().unwrap();
    let initrd = kit.initramfs(&tmp.path().join("initrd"), &guest_script());
    let disk = documented_disk(&c.nodes[2].nbd_unix, "vm");
    let mut vm = kit.start_disk(&initrd, &disk, &tmp.path().join("vm"), Start::Boot);
    wait_for_tick(&vm, 5, "the VM's loop to run");
    let gaps = TickGaps::watch(&vm);

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
        // The VM's loop goes on (on node 3 after its own restart too).
        wait_for_tick(&vm, last_tick(&vm) + 3, "the VM's loop after the restart");
        let vm_gap = gaps.take_longest();
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
             longest write or FLUSH {max_ms:.1} ms; the VM (node 3): longest time \
             between two rounds of its loop {:.1} ms, at round {}",
            i + 1,
            via + 1,
            vm_gap.as_secs_f64() * 1e3,
            last_tick(&vm)
        );
        stalls.push((i + 1, max_ms, vm_gap.as_millis()));
    }

    // The guest's own final verify, then its disk read through node 1.
    drop(gaps);
    let last = finish(&mut vm, "the VM after the upgrade");
    verify_records(
        &read_image(&c.nodes[0].uri("vm"), tmp.path(), disk_len(last)),
        last,
    );
    eprintln!("the VM: {last} rounds, no I/O error, every record read back through node 1");

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

    let r = json(&c.drove(0, &["vdi", "check", "vm", "--json"]));
    assert_eq!(r["identical"], r["objects"], "{r}");
    eprintln!(
        "per restart (node, longest fio write or FLUSH ms, longest VM loop round ms): \
         {stalls:?}"
    );
}
