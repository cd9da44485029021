//! A VM rides through its own node's restart (issue 44, item 5). The guest's disk is
//! attached through node 1's unix socket with the `-blockdev` line of
//! docs/qemu-libvirt.md, read from that file, so the test covers the definition the
//! docs hand out, `reconnect-delay` included. The guest writes, syncs, reads back
//! and verifies a counter and a log of records in a loop while node 1 is SIGKILLed
//! and started again 2 s later. QEMU's NBD client holds the guest's requests while
//! it reconnects, so the loop must see no error, and every record must be on the
//! disk afterwards, read through node 2.
mod common;
use common::vm::{Start, Vm, VmKit};
use common::*;
use std::time::{Duration, Instant};

/// The QEMU/libvirt page users copy their disk definitions from.
const DOC: &str = include_str!("../../../docs/qemu-libvirt.md");
/// The socket path and VDI name the documented `-blockdev` line uses.
const DOC_SOCKET: &str = "/var/lib/drove/nbd.sock";
const DOC_EXPORT: &str = "export=vm1,";

/// 512-byte sectors of the VDI: the counter in sector `COUNTER_SECTOR`, record `n`
/// (from 1) in sector `LOG_BASE + n`.
const COUNTER_SECTOR: usize = 0;
const LOG_BASE: usize = 8;
/// Loop iterations to see before the kill and after the restart.
const TICKS: u64 = 10;
const BOOT: Duration = Duration::from_secs(120);
/// How long node 1 stays down: a crash and its restart by systemd.
const OUTAGE: Duration = Duration::from_secs(2);
/// What the console must never show: the loop's error marker, and the kernel's
/// report of a failed disk request.
const ERRORS: [&str; 2] = ["DROVE-ERROR", "I/O error"];

/// The disk's QEMU arguments as docs/qemu-libvirt.md gives them (`-blockdev
/// driver=nbd,server.type=unix,...` and its `-device`), for VDI `vdi` on the node
/// whose unix socket is `socket`.
fn documented_disk(socket: &str, vdi: &str) -> Vec<String> {
    let lines: Vec<&str> = DOC.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("-blockdev driver=nbd,server.type=unix,"))
        .expect("no `-blockdev driver=nbd,server.type=unix,...` line in docs/qemu-libvirt.md");
    // `-OPT VALUE \` as a shell line continuation writes it.
    let value = |line: &str, opt: &str| {
        line.strip_prefix(opt)
            .unwrap_or_else(|| panic!("docs/qemu-libvirt.md: `{opt}` expected: {line}"))
            .trim_end_matches('\\')
            .trim()
            .to_string()
    };
    let blockdev = value(lines[at], "-blockdev ");
    let device = value(lines[at + 1], "-device ");
    assert!(
        blockdev.contains(DOC_SOCKET) && blockdev.contains(DOC_EXPORT),
        "the documented -blockdev line changed: {blockdev}"
    );
    // QEMU's option syntax doubles a comma inside a value.
    let blockdev = blockdev
        .replace(DOC_SOCKET, &socket.replace(',', ",,"))
        .replace(DOC_EXPORT, &format!("export={vdi},"));
    vec!["-blockdev".into(), blockdev, "-device".into(), device]
}

/// The guest's loop (busybox sh), as in e2e_migrate: each iteration checks that the
/// counter on the disk is the last one written, appends record n, writes counter n,
/// reads both back and prints `DROVE-TICK n`; a failure prints `DROVE-ERROR ...` and
/// the loop goes on. A line typed on the console ends it; then every record is read
/// back again. Writes are fsynced (an error is dd's exit status) and `fresh` drops
/// the guest's cached copy of the disk before reads, so every step reaches drove.
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

/// The counters of the complete `DROVE-TICK n` lines of a console log (digits only:
/// the echo of the `stop` typed at the end can follow them on the same line).
fn ticks(console: &str) -> Vec<u64> {
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

fn assert_no_errors(what: &str, vm: &Vm) {
    let console = vm.console();
    for marker in ERRORS {
        assert!(
            !console.contains(marker),
            "{what}: the guest saw `{marker}`:\n{console}\nQEMU:\n{}",
            vm.qemu_errors()
        );
    }
}

/// Wait until `vm` printed tick `n` or later; fail at once on an error.
fn wait_for_tick(vm: &Vm, n: u64, what: &str) {
    wait_until(BOOT, what, || {
        assert_no_errors(what, vm);
        last_tick(vm) >= n
    });
}

/// The text of a sector as the guest wrote it (a line padded with zeros).
fn sector_text(disk: &[u8], sector: usize) -> String {
    let s = &disk[sector * 512..(sector + 1) * 512];
    String::from_utf8_lossy(s)
        .trim_end_matches('\0')
        .to_string()
}

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

    vm.type_line("stop");
    let status = vm.wait_exit(BOOT);
    assert!(status.success(), "QEMU: {status} {}", vm.qemu_errors());
    assert_no_errors("after the restart", &vm);
    let console = vm.console();
    let all = ticks(&console);
    let last = *all.last().unwrap();
    assert_eq!(all, (1..=last).collect::<Vec<_>>(), "a gap in the counter");
    assert!(
        console.contains(&format!("DROVE-FINAL OK {last}")),
        "the guest's final verify:\n{console}"
    );

    // Every record, read from the host through node 2.
    let data = read_image(
        &c.nodes[1].uri("ride"),
        tmp.path(),
        (LOG_BASE + last as usize + 1) * 512,
    );
    assert_eq!(
        sector_text(&data, COUNTER_SECTOR),
        format!("DROVE-CTR {last}\n")
    );
    for n in 1..=last {
        let got = sector_text(&data, LOG_BASE + n as usize);
        assert_eq!(got, format!("DROVE-REC {n}\n"), "record {n} of {last}");
    }
    eprintln!(
        "node 1 killed at tick {at_kill}, serving again after {serving:?}, the guest's \
         loop going on after {resumed:?}; {last} records verified through node 2, no error"
    );
}
