//! QEMU live migration between two QEMU processes whose disks attach through two
//! different drove nodes (issue 4). The guest writes, reads back and verifies a
//! counter and a log of records on its raw disk in a loop while it is migrated from a
//! QEMU on node 0 to a QEMU on node 1; the write lock moves with `drove vdi handover`.
//! The loop must never see an error, the counter must continue without a gap, every
//! record must be on the disk afterwards, and node 0 must refuse writes once the lock
//! has moved.
mod common;
use common::guest_loop::*;
use common::vm::{Start, Vm, VmKit};
use common::*;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Loop iterations to see on each side of the migration before moving on.
const TICKS_PER_SIDE: u64 = 10;

/// The old gateway (node `old`, where the paused source is still attached) must
/// refuse a write into record 1 after the handover, and the record must stay as it
/// was (read through node `reader`).
fn assert_old_gateway_refuses_writes(
    c: &Cluster,
    old: usize,
    vdi: &str,
    (reader, dir): (usize, &Path),
) {
    let offset = (LOG_BASE + 1) * 512;
    let o = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        &format!("write -P 0x55 {offset} 512"),
        &c.nodes[old].uri(vdi),
    ]));
    let t = text(&o);
    assert!(
        t.contains("Operation not permitted"),
        "a write through the old gateway must fail with EPERM: {t}"
    );
    let disk = read_image(&c.nodes[reader].uri(vdi), dir, disk_len(1));
    assert_eq!(sector_text(&disk, LOG_BASE + 1), "DROVE-REC 1\n");
}

/// The console checks: no errors on either side, ticks on both sides, the counter
/// continues across the switch, and the guest's final verify passed.
fn assert_consoles(source: &str, destination: &str) -> u64 {
    assert_console_clean("source", source, "");
    assert_console_clean("destination", destination, "");
    let (src, dst) = (ticks(source), ticks(destination));
    assert!(src.len() as u64 >= TICKS_PER_SIDE, "source:\n{source}");
    assert!(
        dst.len() as u64 >= TICKS_PER_SIDE,
        "destination:\n{destination}"
    );
    // The migration can stop the guest in the middle of a line, so the whole line
    // is only in the joined output: check the counter there, and the sides' ends
    // exactly when no line was cut.
    let joined = ticks(&format!("{source}{destination}"));
    let last = *joined.last().unwrap();
    assert_eq!(
        joined,
        (1..=last).collect::<Vec<_>>(),
        "a gap in the counter"
    );
    if source.ends_with('\n') {
        assert_eq!(
            dst[0],
            src[src.len() - 1] + 1,
            "destination starts after the source"
        );
    }
    assert!(
        destination.contains(&format!("DROVE-FINAL OK {last}")),
        "the guest's final verify:\n{destination}"
    );
    last
}

/// Migrate `source` to `destination` (started with [`Start::Incoming`]) the way
/// docs/qemu-libvirt.md describes: migrate, hand the VDI's write lock to node
/// `to` (the destination's) while both are paused, resume the destination. Returns
/// how long the migration itself took.
fn migrate_and_hand_over(
    c: &Cluster,
    vdi: &str,
    source: &mut Vm,
    destination: &mut Vm,
    to: usize,
) -> Duration {
    let started = Instant::now();
    let port = destination.listen_for_migration();
    source.migrate_to(port, Duration::from_secs(60));
    let migration = started.elapsed();
    assert_eq!(source.status(), "postmigrate");

    let to_id = c.nodes[to].id.to_string();
    let o = c.drove(to, &["vdi", "handover", vdi, "--to", &to_id]);
    assert!(o.status.success(), "handover: {}", text(&o));
    destination.qmp.execute("cont", json!({})).unwrap();
    assert_eq!(destination.status(), "running");
    migration
}

/// End the guest's loop and wait for its final verify and power-off.
fn stop_guest(vm: &mut Vm) {
    vm.type_line("stop");
    let status = vm.wait_exit(BOOT);
    assert!(status.success(), "QEMU: {status} {}", vm.qemu_errors());
}

/// Run the guest on node `from`, migrate it to node `to` while it writes, and check
/// everything through node `reader` (see the module doc). Returns the last record.
fn migrate_while_writing(
    kit: &VmKit,
    c: &Cluster,
    (from, to, reader): (usize, usize, usize),
) -> u64 {
    let tmp = tempfile::tempdir().unwrap();
    let initrd = kit.initramfs(&tmp.path().join("initrd"), &guest_script());

    let mut source = kit.start(
        &initrd,
        &c.nodes[from].uri("mig"),
        &tmp.path().join("src"),
        Start::Boot,
    );
    wait_for_tick(&source, TICKS_PER_SIDE, "the loop to run on the source");

    let dst_dir = tmp.path().join("dst");
    let mut destination = kit.start(&initrd, &c.nodes[to].uri("mig"), &dst_dir, Start::Incoming);
    let migration = migrate_and_hand_over(c, "mig", &mut source, &mut destination, to);
    let paused_at = last_tick(&source);

    // The paused source stays attached to node 0 while the guest writes through
    // node 1: only the handover allows that (without it node 1 waits for node 0's
    // lock and its writes fail with EPERM).
    wait_for_tick(
        &destination,
        paused_at + TICKS_PER_SIDE,
        "the loop to go on on the destination",
    );
    assert_old_gateway_refuses_writes(c, from, "mig", (reader, tmp.path()));
    source.quit();

    stop_guest(&mut destination);

    let last = assert_consoles(&source.console(), &destination.console());
    let disk = read_image(&c.nodes[reader].uri("mig"), tmp.path(), disk_len(last));
    verify_records(&disk, last);
    eprintln!(
        "migrated in {migration:?} after tick {paused_at}; {last} records verified through node {}",
        c.nodes[reader].id
    );
    last
}

#[test]
fn test_live_migration_between_two_nodes_loses_no_write_and_fences_the_old_gateway() {
    let Some(kit) = require_ok(VmKit::find()) else {
        return;
    };
    if !require(&["qemu-io", "qemu-img"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("mig", "32M", &["--copies", "3"]);
    migrate_while_writing(&kit, &c, (0, 1, 2));
}

/// How many object files of VDI `id` node `i` stores.
fn objects_on(c: &Cluster, i: usize, id: u64) -> usize {
    let dir = Path::new(&c.nodes[i].data).join(format!("store/objects/{id:08x}"));
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|g| std::fs::read_dir(g.path()).into_iter().flatten().flatten())
        .filter(|f| f.path().extension().is_none())
        .count()
}

fn vdi_json(c: &Cluster, name: &str) -> serde_json::Value {
    let o = c.drove(0, &["vdi", "info", name, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The VM migrates from a node of zone z1 to a node of zone z3 (a move between
/// datacenters) while writing a zone-sync VDI: nothing is lost, the home zone moves
/// to z3, and the objects follow in the background until both z3 nodes hold every
/// object and the copies that moved away are dropped.
#[test]
fn test_live_migration_to_another_zone_moves_the_home_zone_and_the_objects() {
    let Some(kit) = require_ok(VmKit::find()) else {
        return;
    };
    if !require(&["qemu-io", "qemu-img"]) {
        return;
    }
    // Six nodes round-robin in three zones: nodes 0 and 3 in z1, 2 and 5 in z3.
    let c = Cluster::start(6, 3);
    let zone = |i: usize| c.nodes[i].zone.clone();
    assert_eq!(
        (zone(0), zone(3), zone(2), zone(5)),
        ("z1".into(), "z1".into(), "z3".into(), "z3".into())
    );
    c.create_vdi("mig", "32M", &["--copies", "3", "--policy", "zone-sync"]);
    migrate_while_writing(&kit, &c, (0, 2, 4));
    let v = vdi_json(&c, "mig");
    assert_eq!(v["home_zone"], "z3", "{v}");
    assert_eq!(v["past_homes"][0]["zone"], "z1", "{v}");
    let id = v["id"].as_u64().unwrap();
    let mut held = Vec::new();
    wait_until(
        Duration::from_secs(180),
        "the objects to move to z3",
        || {
            held = (0..6).map(|i| objects_on(&c, i, id)).collect();
            // Both z3 nodes hold every object and no object has more than its three
            // copies (the third may stay in z1: one copy per other zone).
            held[2] > 0 && held[2] == held[5] && held.iter().sum::<usize>() == 3 * held[2]
        },
    );
    eprintln!("objects per node after the move: {held:?}");
    let o = c.drove(4, &["vdi", "check", "mig", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let check: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(check["identical"], check["objects"], "{check}");
}
