//! QEMU live migration between two QEMU processes whose disks attach through two
//! different drove nodes (issue 4). The guest writes, reads back and verifies a
//! counter and a log of records on its raw disk in a loop while it is migrated from a
//! QEMU on node 0 to a QEMU on node 1; the write lock moves with `drove vdi handover`.
//! The loop must never see an error, the counter must continue without a gap, every
//! record must be on the disk afterwards, and node 0 must refuse writes once the lock
//! has moved.
mod common;
use common::vm::{Start, Vm, VmKit};
use common::*;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// 512-byte sectors of the VDI the guest writes: the counter in sector
/// `COUNTER_SECTOR`, record `n` (from 1) in sector `LOG_BASE + n`.
const COUNTER_SECTOR: usize = 0;
const LOG_BASE: usize = 8;
/// Loop iterations to see on each side of the migration before moving on.
const TICKS_PER_SIDE: u64 = 10;
const BOOT: Duration = Duration::from_secs(120);
/// What a console must never show: the guest's own error marker, and the kernel's
/// report of a failed disk request (in case a failure escaped the loop's checks).
const ERRORS: [&str; 2] = ["DROVE-ERROR", "I/O error"];

/// The guest's loop (busybox sh). Each iteration checks that the counter on the disk
/// is the last one written (a write lost across the switch shows here), appends
/// record n, writes counter n, reads both back and prints `DROVE-TICK n`. Any failure
/// prints `DROVE-ERROR ...` and the loop goes on. A line typed on the console ends
/// the loop; then every record is read back again.
///
/// No O_DIRECT: busybox dd silently retries without it when the kernel refuses its
/// unaligned buffer (EINVAL), and the write would then fail only later, in writeback.
/// Instead a write is fsynced (its error is dd's exit status) and `fresh` drops the
/// guest's cached copy of the disk (BLKFLSBUF) before reads, so they go to drove.
fn guest_script() -> String {
    format!(
        r#"CTR={COUNTER_SECTOR}; BASE={LOG_BASE}
put() {{ printf '%s\n' "$2" | dd of=/dev/vda bs=512 seek=$1 count=1 conv=sync,notrunc,fsync 2>/dev/null; }}
fresh() {{ blockdev --flushbufs /dev/vda || echo "DROVE-ERROR flushbufs"; }}
get() {{ dd if=/dev/vda bs=512 skip=$1 count=1 2>/dev/null | tr -d '\000'; }}
check() {{ [ "$(get $1)" = "$2" ]; }}
(read line < /dev/ttyS0; : > /tmp/stop) &
last=0
put $CTR "DROVE-CTR 0" || echo "DROVE-ERROR write counter 0"
while [ ! -e /tmp/stop ]; do
  fresh
  check $CTR "DROVE-CTR $last" || echo "DROVE-ERROR counter on disk is '$(get $CTR)', expected $last"
  n=$((last+1))
  put $((BASE+n)) "DROVE-REC $n" || echo "DROVE-ERROR write record $n"
  put $CTR "DROVE-CTR $n" || echo "DROVE-ERROR write counter $n"
  fresh
  check $((BASE+n)) "DROVE-REC $n" || echo "DROVE-ERROR verify record $n"
  check $CTR "DROVE-CTR $n" || echo "DROVE-ERROR verify counter $n"
  last=$n
  echo "DROVE-TICK $n"
done
fresh; bad=0; i=1
while [ $i -le $last ]; do
  check $((BASE+i)) "DROVE-REC $i" || {{ echo "DROVE-ERROR final record $i"; bad=$((bad+1)); }}
  i=$((i+1))
done
if [ $bad -eq 0 ]; then echo "DROVE-FINAL OK $last"; else echo "DROVE-FINAL FAIL $bad of $last"; fi"#
    )
}

/// The counters of the complete `DROVE-TICK n` lines of a console log.
fn ticks(console: &str) -> Vec<u64> {
    // The number's digits only: the serial line's echo of `stop` typed at the end
    // can land right after them ("DROVE-TICK 33stop", seen in CI).
    console
        .lines()
        .filter_map(|l| l.strip_prefix("DROVE-TICK "))
        .filter_map(|n| {
            let digits = n.len() - n.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            n[..digits].parse().ok()
        })
        .collect()
}

fn last_tick(vm: &Vm) -> u64 {
    ticks(&vm.console()).last().copied().unwrap_or(0)
}

/// Wait until `vm` printed tick `n` or later; fail early on an error marker.
fn wait_for_tick(vm: &Vm, n: u64, what: &str) {
    wait_until(BOOT, what, || {
        let console = vm.console();
        assert_no_errors(what, &console);
        ticks(&console).last().is_some_and(|&t| t >= n)
    });
}

fn assert_no_errors(what: &str, console: &str) {
    for marker in ERRORS {
        assert!(!console.contains(marker), "{what}: {marker}:\n{console}");
    }
}

/// The first `sectors` sectors of the VDI, read from the host through `uri`.
fn read_disk(uri: &str, dir: &Path, sectors: usize) -> Vec<u8> {
    read_image(uri, dir, sectors * 512)
}

/// The text of a sector as the guest wrote it (a line padded with zeros).
fn sector_text(disk: &[u8], sector: usize) -> String {
    let s = &disk[sector * 512..(sector + 1) * 512];
    String::from_utf8_lossy(s)
        .trim_end_matches('\0')
        .to_string()
}

/// Every record 1..=last and the counter `last` are on the disk as written.
fn assert_records(disk: &[u8], last: u64) {
    assert_eq!(
        sector_text(disk, COUNTER_SECTOR),
        format!("DROVE-CTR {last}\n")
    );
    for n in 1..=last {
        let got = sector_text(disk, LOG_BASE + n as usize);
        assert_eq!(got, format!("DROVE-REC {n}\n"), "record {n} of {last}");
    }
}

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
    let disk = read_disk(&c.nodes[reader].uri(vdi), dir, LOG_BASE + 2);
    assert_eq!(sector_text(&disk, LOG_BASE + 1), "DROVE-REC 1\n");
}

/// The console checks: no errors on either side, ticks on both sides, the counter
/// continues across the switch, and the guest's final verify passed.
fn assert_consoles(source: &str, destination: &str) -> u64 {
    assert_no_errors("source", source);
    assert_no_errors("destination", destination);
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
    let disk = read_disk(
        &c.nodes[reader].uri("mig"),
        tmp.path(),
        LOG_BASE + last as usize + 1,
    );
    assert_records(&disk, last);
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
