//! A VM rides through its own node's restart (issue 44, item 5). The guest's disk is
//! attached through node 1's unix socket with the `-blockdev` line of
//! docs/qemu-libvirt.md, read from that file, so the test covers the definition the
//! docs hand out, `reconnect-delay` included. The guest writes, syncs, reads back
//! and verifies a counter and a log of records in a loop while node 1 is SIGKILLed
//! and started again 2 s later. QEMU's NBD client holds the guest's requests while
//! it reconnects, so the loop must see no error, and every record must be on the
//! disk afterwards, read through node 2.
mod common;
use common::guest_loop::*;
use common::vm::{Start, VmKit};
use common::*;
use std::time::{Duration, Instant};

/// Loop iterations to see before the kill and after the restart.
const TICKS: u64 = 10;
/// How long node 1 stays down: a crash and its restart by systemd.
const OUTAGE: Duration = Duration::from_secs(2);

#[test]
fn test_a_vm_writing_through_its_node_rides_through_the_nodes_restart() {
    let Some(kit) = require_ok(VmKit::find()) else {
        return;
    };
    if !require(&["qemu-img"]) {
        return;
    }
    let mut c = Cluster::start(3, 3);
    c.create_vdi("ride", "32M", &["--copies", "3"]);
    let disk = documented_disk(&c.nodes[0].nbd_unix, "ride");
    assert!(
        disk[1].contains("reconnect-delay="),
        "the documented disk asks QEMU to reconnect: {disk:?}"
    );
    eprintln!("disk: {}", disk.join(" "));

    let tmp = tempfile::tempdir().unwrap();
    let initrd = kit.initramfs(&tmp.path().join("initrd"), &guest_script());
    let mut vm = kit.start_disk(&initrd, &disk, &tmp.path().join("vm"), Start::Boot);
    wait_for_tick(&vm, TICKS, "the loop to run before the kill");

    let killed = Instant::now();
    c.kill(0);
    let at_kill = last_tick(&vm);
    // The outage itself, not a wait for something: the node is down this long.
    std::thread::sleep(OUTAGE);
    // The guest's loop stood still while its node was gone (at most the tick in
    // progress ended): its requests were held, not answered.
    assert_no_errors("while the node was down", &vm);
    let at_restart = last_tick(&vm);
    assert!(
        at_restart <= at_kill + 1,
        "the guest went on from tick {at_kill} to {at_restart} with its node down"
    );
    c.restart(0);
    let serving = killed.elapsed();
    wait_for_tick(&vm, at_restart + 1, "the loop to go on after the restart");
    let resumed = killed.elapsed();
    wait_for_tick(&vm, at_restart + TICKS, "more ticks after the restart");

    let last = finish(&mut vm, "after the restart");
    // Every record, read from the host through node 2.
    verify_records(
        &read_image(&c.nodes[1].uri("ride"), tmp.path(), disk_len(last)),
        last,
    );
    eprintln!(
        "node 1 killed at tick {at_kill}, serving again after {serving:?}, the guest's \
         loop going on after {resumed:?}; {last} records verified through node 2, no error"
    );
}
