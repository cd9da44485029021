//! A VM whose guest checks its own disk in a loop, for tests of what a running VM
//! sees while drove nodes restart (e2e_reconnect, e2e_rolling_upgrade). The disk is
//! attached with the `-blockdev` line of docs/qemu-libvirt.md, read from that file,
//! so the tests cover the definition the docs hand out, `reconnect-delay` included.
//! The guest writes, syncs, reads back and verifies a counter and a log of records,
//! printing `DROVE-TICK n` per round and `DROVE-ERROR ...` on any failure; a line
//! typed on its console ends the loop and every record is verified once more.
use super::vm::Vm;
use super::wait_until;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The QEMU/libvirt page users copy their disk definitions from.
const DOC: &str = include_str!("../../../../docs/qemu-libvirt.md");
/// The socket path and VDI name the documented `-blockdev` line uses.
const DOC_SOCKET: &str = "/var/lib/drove/nbd.sock";
const DOC_EXPORT: &str = "export=vm1,";

/// 512-byte sectors of the VDI: the counter in sector `COUNTER_SECTOR`, record `n`
/// (from 1) in sector `LOG_BASE + n`.
pub const COUNTER_SECTOR: usize = 0;
pub const LOG_BASE: usize = 8;
pub const BOOT: Duration = Duration::from_secs(120);
/// What the console must never show: the loop's error marker, and the kernel's
/// report of a failed disk request.
pub const ERRORS: [&str; 2] = ["DROVE-ERROR", "I/O error"];

/// The disk's QEMU arguments as docs/qemu-libvirt.md gives them (`-blockdev
/// driver=nbd,server.type=unix,...` and its `-device`), for VDI `vdi` on the node
/// whose unix socket is `socket`.
pub fn documented_disk(socket: &str, vdi: &str) -> Vec<String> {
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
/// the guest's cached copy of the disk (BLKFLSBUF) before reads, so every step
/// reaches drove. No O_DIRECT: busybox dd silently retries without it when the
/// kernel refuses its unaligned buffer (EINVAL), and the write would then fail only
/// later, in writeback.
pub fn guest_script() -> String {
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
pub fn ticks(console: &str) -> Vec<u64> {
    console
        .lines()
        .filter_map(|l| l.strip_prefix("DROVE-TICK "))
        .filter_map(|n| {
            let digits = n.len() - n.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            n[..digits].parse().ok()
        })
        .collect()
}

pub fn last_tick(vm: &Vm) -> u64 {
    ticks(&vm.console()).last().copied().unwrap_or(0)
}

pub fn assert_no_errors(what: &str, vm: &Vm) {
    assert_console_clean(what, &vm.console(), &vm.qemu_errors());
}

/// [`assert_no_errors`] on a console's text (`qemu`: what QEMU printed, for the
/// message).
pub fn assert_console_clean(what: &str, console: &str, qemu: &str) {
    for marker in ERRORS {
        assert!(
            !console.contains(marker),
            "{what}: the guest saw `{marker}`:\n{console}\nQEMU:\n{qemu}"
        );
    }
}

/// Wait until `vm` printed tick `n` or later; fail at once on an error.
pub fn wait_for_tick(vm: &Vm, n: u64, what: &str) {
    wait_until(BOOT, what, || {
        // One read of the console per look; QEMU's own errors only for a failure.
        let console = vm.console();
        if ERRORS.iter().any(|m| console.contains(m)) {
            assert_console_clean(what, &console, &vm.qemu_errors());
        }
        ticks(&console).last().is_some_and(|&t| t >= n)
    });
}

/// The text of a sector as the guest wrote it (a line padded with zeros).
pub fn sector_text(disk: &[u8], sector: usize) -> String {
    let s = &disk[sector * 512..(sector + 1) * 512];
    String::from_utf8_lossy(s)
        .trim_end_matches('\0')
        .to_string()
}

/// Type the line that ends the guest's loop, wait for QEMU to exit and check the
/// guest's own final verify and its ticks (1, 2, ... with no gap). Returns the
/// number of records written.
pub fn finish(vm: &mut Vm, what: &str) -> u64 {
    vm.type_line("stop");
    let status = vm.wait_exit(BOOT);
    assert!(status.success(), "QEMU: {status} {}", vm.qemu_errors());
    assert_no_errors(what, vm);
    let console = vm.console();
    let all = ticks(&console);
    let last = *all.last().expect("no tick at all");
    assert_eq!(all, (1..=last).collect::<Vec<_>>(), "a gap in the counter");
    assert!(
        console.contains(&format!("DROVE-FINAL OK {last}")),
        "the guest's final verify:\n{console}"
    );
    last
}

/// The bytes the guest's disk must hold at least: the counter and `last` records.
pub fn disk_len(last: u64) -> usize {
    (LOG_BASE + last as usize + 1) * 512
}

/// Check the counter and every record of `last` in `data` (the disk read from the
/// host, [`disk_len`] bytes or more).
pub fn verify_records(data: &[u8], last: u64) {
    assert_eq!(
        sector_text(data, COUNTER_SECTOR),
        format!("DROVE-CTR {last}\n")
    );
    for n in 1..=last {
        let got = sector_text(data, LOG_BASE + n as usize);
        assert_eq!(got, format!("DROVE-REC {n}\n"), "record {n} of {last}");
    }
}

/// The longest time the guest's loop went without a new tick, watched from the
/// host by a thread that reads the console log every 50 ms.
pub struct TickGaps {
    state: Arc<Mutex<GapState>>,
    stop: Arc<AtomicBool>,
}

struct GapState {
    last: u64,
    since: Instant,
    longest: Duration,
}

impl TickGaps {
    pub fn watch(vm: &Vm) -> TickGaps {
        let log: PathBuf = vm.console_path().to_path_buf();
        let state = Arc::new(Mutex::new(GapState {
            last: 0,
            since: Instant::now(),
            longest: Duration::ZERO,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                let text =
                    String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
                let now = ticks(&text).last().copied().unwrap_or(0);
                let mut s = st.lock();
                let gap = s.since.elapsed();
                s.longest = s.longest.max(gap);
                if now != s.last {
                    s.last = now;
                    s.since = Instant::now();
                }
                drop(s);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        TickGaps { state, stop }
    }

    /// The longest gap between two ticks since the last call (or the start), and
    /// start measuring again.
    pub fn take_longest(&self) -> Duration {
        let mut s = self.state.lock();
        std::mem::take(&mut s.longest)
    }
}

impl Drop for TickGaps {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
