//! A real power loss of a whole site: three real `drove` node processes keep their
//! data directories on one ext4 image that outagefs records (common/outage.rs), a
//! libnbd client writes self-describing blocks with FUA and FLUSH through node 1
//! (scripts/power-loss-client.py) and logs every write acknowledged durable in an
//! ack log it fsyncs on the same file system. Then the recording is cut: each cut is
//! the image as a power loss at that moment leaves it (writes not yet synced dropped,
//! any subset of them). For each cut the cluster restarts in the replayed image, and
//! every block is read back through one of the nodes: each write the surviving ack
//! log names is there (or a later write of the same block), no block holds anything
//! the client never wrote, `vdi check` finds every replica identical, the metadata
//! (the VDI, its size, the map) is intact, and the VDI takes writes again.
//!
//! One cut is one run. `make test` runs 4; more, to measure (docs/self-healing.md):
//! `POWER_LOSS_CUTS=20 cargo test --release -p drove --test e2e_power_loss -- --nocapture`
//! (`POWER_LOSS_SEED=N` replays the cuts of a seed printed by an earlier run; the
//! recording itself differs from run to run). A failed run keeps its recording:
//! `POWER_LOSS_REPLAY=<kept dir> POWER_LOSS_WRITES=<writes=N> POWER_LOSS_FILTER=<filter>`
//! replays that recording's failed cut, in the kept directory (the nodes'
//! configuration names it).
//!
//! Some cuts leave blocks whose every copy holds an unflushed write's data under the
//! previous checksum; before recovery sealed such blocks (docs/self-healing.md,
//! "Power loss") they read as EIO through every node and the post-crash repair never
//! completed. Each run's line says how many object copies had blocks sealed.
mod common;
use common::outage::{self, Change, Cut, Held};
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const VDI: &str = "pl";
const VDI_BYTES: usize = 32 << 20;
const BLOCK: usize = 4096;
/// Three replicas of a 32 MiB VDI, the nodes' metadata and logs, with room to spare
/// (a node calls its disk unhealthy under 16 MiB free; the three share this one).
const IMAGE_MIB: u64 = 256;
/// Seconds of writes recorded.
const WRITE_SECONDS: u64 = 3;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

/// splitmix64: the cut points of a seed, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The cluster in the image: `drove up --dir` of a directory on the mounted image.
struct Site {
    dir: PathBuf,
    nodes: Vec<Node>,
    /// Where the nodes' logs are copied if the test panics while the site runs.
    logs_to: PathBuf,
}

impl Site {
    /// A new 3-node cluster (one zone each) in `dir`.
    fn create(dir: &Path, logs_to: &Path) -> Site {
        let o = run(Command::new(drove_bin())
            .args(["up", "--nodes", "3", "--zones", "3", "--detach"])
            .args(["--base-port", "0", "--no-tls", "--no-auth", "--dir"])
            .arg(dir));
        assert!(o.status.success(), "drove up: {}", text(&o));
        Site {
            dir: dir.to_path_buf(),
            nodes: nodes_of(dir),
            logs_to: logs_to.to_path_buf(),
        }
    }

    /// Start the cluster in `dir` again after a power loss, its hosts in boot `boot`
    /// (a new one: every node's recovery record was written in another, so no node
    /// trusts its copies as current before comparing them).
    fn restart(dir: &Path, logs_to: &Path, boot: &str) -> Site {
        // cluster.json names the processes that ran before the power went; after a
        // real one no such process exists, here a new process may have its pid, and
        // `drove up` would take the cluster for running. The pids are forgotten.
        let file = dir.join("cluster.json");
        let mut f: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        for n in f["nodes"].as_array_mut().unwrap() {
            n["pid"] = Value::from(0);
        }
        std::fs::write(&file, serde_json::to_vec_pretty(&f).unwrap()).unwrap();
        let mut site = Site {
            dir: dir.to_path_buf(),
            nodes: nodes_of(dir),
            logs_to: logs_to.to_path_buf(),
        };
        let o = run(Command::new(drove_bin())
            .env("DROVE_TEST_BOOT_ID", boot)
            .args(["up", "--detach", "--dir"])
            .arg(dir));
        site.nodes = nodes_of(dir);
        assert!(
            o.status.success(),
            "the cluster does not start after the power loss: {}",
            text(&o)
        );
        site
    }

    fn drove(&self, i: usize, args: &[&str]) -> std::process::Output {
        run(Command::new(drove_bin())
            .args(args)
            .args(["--cluster", &self.nodes[i].admin]))
    }

    fn json(&self, i: usize, args: &[&str]) -> Value {
        let o = self.drove(i, args);
        assert!(o.status.success(), "drove {args:?}: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
    }

    /// The power goes: every node is SIGKILLed at once, nothing is flushed.
    fn power_off(&self) {
        assert!(self.kill_all(), "a killed node did not end in 30 s");
    }

    /// SIGKILL every node; whether they all ended within 30 s.
    fn kill_all(&self) -> bool {
        for n in &self.nodes {
            signal(n.pid, Signal::KILL);
        }
        let end = Instant::now() + Duration::from_secs(30);
        self.nodes.iter().all(|n| loop {
            reap(n.pid);
            if !exists(n.pid) || zombie(n.pid) {
                break true;
            }
            if Instant::now() > end {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        })
    }

    /// `drove down`: what the test does once a run has checked everything.
    fn down(&self) {
        let o = run(Command::new(drove_bin())
            .args(["down", "--dir"])
            .arg(&self.dir));
        assert!(o.status.success(), "drove down: {}", text(&o));
    }

    fn copy_logs(&self) {
        let _ = std::fs::create_dir_all(&self.logs_to);
        for (i, n) in self.nodes.iter().enumerate() {
            let _ = std::fs::copy(
                Path::new(&n.data).join("node.log"),
                self.logs_to.join(format!("node{}.log", i + 1)),
            );
        }
    }
}

impl Drop for Site {
    /// Nothing may keep running in the image once the test is done with it.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.copy_logs();
        }
        let _ = Command::new(drove_bin())
            .args(["down", "--dir"])
            .arg(&self.dir)
            .output();
        self.kill_all();
    }
}

/// The nodes cluster.json in `dir` names.
fn nodes_of(dir: &Path) -> Vec<Node> {
    let bytes = std::fs::read(dir.join("cluster.json")).unwrap();
    let f: drove_types::local_cluster::ClusterFile = serde_json::from_slice(&bytes).unwrap();
    f.nodes
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The block a write of the client put at `offset` (scripts/power-loss-client.py
/// makes the same bytes): its header, then 4064 bytes of xorshift64 from (offset, seq).
fn expected_block(offset: u64, seq: u64, count: u32, index: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCK);
    b.extend_from_slice(b"DRVPWR01");
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(&index.to_le_bytes());
    let mut x = (offset.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ seq.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
    .max(1);
    while b.len() < BLOCK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

/// What a block read back holds: never written (zeros), or write `seq`'s bytes.
fn decode_block(offset: u64, b: &[u8]) -> Result<Option<u64>, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    if &b[..8] != b"DRVPWR01" || u64_at(8) != offset {
        return Err(format!(
            "block at {offset} holds bytes no write put there (starts {:02x?})",
            &b[..24]
        ));
    }
    let seq = u64_at(16);
    if b != expected_block(offset, seq, u32_at(24), u32_at(28)) {
        return Err(format!("block at {offset} (write {seq}) is damaged"));
    }
    Ok(Some(seq))
}

/// The sector a disk writes whole, at the least.
const SECTOR: usize = 512;

/// A block that is no whole write, by 512-byte sector: the write (seq, 1 to
/// `max_seq`) of this block whose bytes each sector holds, or `None` for zeros;
/// `None` in all if a sector holds bytes no write of this block put there.
fn sectors_of(offset: u64, b: &[u8], max_seq: u64) -> Option<Vec<Option<u64>>> {
    let writes: Vec<(u64, Vec<u8>)> = (1..=max_seq)
        .map(|s| (s, expected_block(offset, s, 0, 0)))
        .collect();
    b.chunks(SECTOR)
        .enumerate()
        .map(|(i, sector)| {
            if sector.iter().all(|&x| x == 0) {
                return Some(None);
            }
            let at = i * SECTOR;
            writes
                .iter()
                .find(|(_, w)| {
                    if i == 0 {
                        // The header's count and index (bytes 24..32) are the write's own.
                        w[..24] == sector[..24] && w[32..SECTOR] == sector[32..]
                    } else {
                        w[at..at + SECTOR] == *sector
                    }
                })
                .map(|(s, _)| Some(*s))
        })
        .collect()
}

/// Whether every sector holds the block's newest durable write (`durable`) or a
/// later one; zeros only where the block has no durable write.
fn sectors_keep(sectors: &[Option<u64>], durable: Option<u64>) -> bool {
    sectors.iter().all(|s| match (s, durable) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(s), Some(d)) => *s >= d,
    })
}

/// One write acknowledged durable, as the ack log has it.
#[derive(Clone, Copy, Debug)]
struct Ack {
    offset: u64,
    blocks: u64,
    seq: u64,
    fua: bool,
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    })
}

/// The records of the ack log that survived (none if the file did not). Only its
/// end may be torn: the record being appended when the power went.
fn read_acks(path: &Path) -> Vec<Ack> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut acks = Vec::new();
    let mut torn = None;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let parsed = line.strip_suffix('\n').and_then(|l| {
            let (body, sum) = l.rsplit_once(' ')?;
            (u64::from_str_radix(sum, 16).ok()? == fnv(body)).then_some(())?;
            let w: Vec<&str> = body.split(' ').collect();
            Some(Ack {
                offset: w.first()?.parse().ok()?,
                blocks: w.get(1)?.parse().ok()?,
                seq: w.get(2)?.parse().ok()?,
                fua: *w.get(3)? == "fua",
            })
        });
        match (parsed, torn) {
            (Some(a), None) => acks.push(a),
            (Some(_), Some(t)) => panic!("ack log line {t} is torn but line {n} after it is whole"),
            (None, _) => torn = torn.or(Some(n)),
        }
    }
    acks
}

/// What a run found in the blocks it read.
struct Verified {
    /// Blocks whose newest durable write the ack log names.
    acked: usize,
    /// Of those, blocks holding a later (not yet durable) write of the same block.
    later: usize,
    /// Blocks that are no whole write but a mix of writes of the block by 512-byte
    /// sector, each sector from its newest durable write or a later one: what a disk
    /// leaves of an unflushed write (the image's ext4 tears at 1 KiB).
    mixed: usize,
    /// What is wrong, one line per block.
    bad: Vec<String>,
}

/// Every block of `disk` against the durable writes `acks` names; `unreadable` are
/// the blocks whose read failed (with its errno).
fn verify(disk: &[u8], unreadable: &BTreeMap<u64, String>, acks: &[Ack], max_seq: u64) -> Verified {
    let mut newest: BTreeMap<u64, Ack> = BTreeMap::new();
    for a in acks {
        for i in 0..a.blocks {
            let off = a.offset + i * BLOCK as u64;
            if newest.get(&off).is_none_or(|b| b.seq < a.seq) {
                newest.insert(off, *a);
            }
        }
    }
    let mut bad = Vec::new();
    let mut later = 0;
    let mut mixed = 0;
    for (i, b) in disk.chunks(BLOCK).enumerate() {
        let off = (i * BLOCK) as u64;
        let acked = newest.get(&off);
        let how = |a: &Ack| if a.fua { "FUA" } else { "FLUSH" };
        if let Some(errno) = unreadable.get(&off) {
            bad.push(match acked {
                Some(a) => format!(
                    "block at {off} (object {}, block {}): unreadable (errno {errno}); its newest durable write is {} (by {})",
                    off >> 22,
                    (off >> 12) & 1023,
                    a.seq,
                    how(a)
                ),
                None => format!(
                    "block at {off} (object {}, block {}): unreadable (errno {errno}); no durable write of it, only unacknowledged ones",
                    off >> 22,
                    (off >> 12) & 1023
                ),
            });
            continue;
        }
        let found = match decode_block(off, b) {
            Ok(s) => s,
            Err(e) => {
                match sectors_of(off, b, max_seq) {
                    Some(secs) if sectors_keep(&secs, acked.map(|a| a.seq)) => mixed += 1,
                    Some(secs) => bad.push(format!(
                        "{e}: by sector it holds writes {secs:?}, older than its newest durable write {:?}",
                        acked.map(|a| a.seq)
                    )),
                    None => bad.push(e),
                }
                continue;
            }
        };
        let Some(a) = acked else { continue };
        match found {
            Some(s) if s == a.seq => {}
            Some(s) if s > a.seq => later += 1,
            Some(s) => bad.push(format!(
                "block at {off}: write {} (durable by {}) is lost, the block holds the older write {s}",
                a.seq,
                how(a)
            )),
            None => bad.push(format!(
                "block at {off}: write {} (durable by {}) is lost, the block reads as zeros",
                a.seq,
                how(a)
            )),
        }
    }
    Verified {
        acked: newest.len(),
        later,
        mixed,
        bad,
    }
}

/// Read the whole VDI at `uri` into `out`: its bytes and the blocks that failed.
fn read_all(uri: &str, out: &Path) -> (Vec<u8>, BTreeMap<u64, String>) {
    let o = run(Command::new("/usr/bin/python3")
        .arg(client())
        .args(["read", uri])
        .arg(out));
    assert!(o.status.success(), "reading {uri} failed: {}", text(&o));
    let unreadable = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("unreadable ")?.split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.to_string()))
        })
        .collect();
    (std::fs::read(out).unwrap(), unreadable)
}

fn client() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/power-loss-client.py")
}

/// Record: restart the prepared cluster in the recorded image, write for a few
/// seconds, then cut the power of every node. The workload's summary line.
fn record(dir: &Path, mnt: &Path, seed: u64) -> String {
    let held = Held::record(dir, mnt, &dir.join("record.log"));
    let site = Site::restart(&mnt.join("c"), &dir.join("record-logs"), "recording");
    let o = run(Command::new("/usr/bin/python3")
        .arg(client())
        .arg("write")
        .arg(site.nodes[0].uri(VDI))
        .arg(mnt.join("ack.log"))
        .arg(WRITE_SECONDS.to_string())
        .arg(seed.to_string()));
    assert!(o.status.success(), "the workload failed: {}", text(&o));
    site.power_off();
    drop(site);
    held.release();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The cuts of a run: mostly a Sync kept with a random subset of the writes after it,
/// every fourth a plain prefix of the recording.
fn plan(changes: &[Change], n: usize, rng: &mut Rng) -> Vec<Cut> {
    let syncs: Vec<usize> = (0..changes.len())
        .filter(|&i| changes[i] == Change::Sync)
        .collect();
    assert!(!syncs.is_empty(), "the recording has no Sync");
    (0..n)
        .map(|k| {
            if k % 4 == 3 {
                outage::cut_prefix(1 + rng.below(changes.len()))
            } else {
                let s = syncs[rng.below(syncs.len())];
                outage::cut_after_sync(changes, s, || rng.next() & 1 == 1)
            }
        })
        .collect()
}

/// One run: the image as `cut` leaves it, the cluster restarted in it, everything
/// checked through node `k % 3 + 1`. A line saying what was checked, or every problem
/// found (a cluster that does not start panics).
fn run_cut(dir: &Path, mnt: &Path, k: usize, cut: &Cut, max_seq: u64) -> Result<String, String> {
    let started = Instant::now();
    let rundir = dir.join(format!("run{k}"));
    std::fs::create_dir_all(&rundir).unwrap();
    let held = Held::replay(dir, mnt, &cut.filter, &rundir.join("outagefs.log"));
    let acks = read_acks(&mnt.join("ack.log"));
    let fua = acks.iter().filter(|a| a.fua).count();
    let site = Site::restart(&mnt.join("c"), &rundir, &format!("after-cut-{k}"));
    let restarted = started.elapsed();
    let via = k % 3;
    // The first attach after the power loss repairs the replicas the writer left
    // (settle), then reads: every block, through a node that may not be the writer's.
    let (disk, unreadable) = read_all(&site.nodes[via].uri(VDI), &rundir.join("disk.raw"));
    assert_eq!(disk.len(), VDI_BYTES);
    let v = verify(&disk, &unreadable, &acks, max_seq);
    let mut problems = Vec::new();
    if !v.bad.is_empty() {
        problems.push(format!(
            "{} bad blocks read through node {} ({} durable writes in the ack log); the first ones:\n  {}",
            v.bad.len(),
            via + 1,
            acks.len(),
            v.bad[..v.bad.len().min(12)].join("\n  ")
        ));
    }
    let check = site.json(via, &["vdi", "check", VDI, "--json"]);
    if !(check["mismatched"].as_array().is_some_and(|m| m.is_empty())
        && check["identical"] == check["objects"]
        && check["degraded"] == 0)
    {
        problems.push(format!("vdi check: {check}"));
    }
    // The metadata: the VDI as created, the repair recorded, the map as built.
    let info = site.json((via + 1) % 3, &["vdi", "info", VDI, "--json"]);
    if info["size"] != VDI_BYTES as u64 || info["object_size"] != 4u64 << 20 || info["copies"] != 3
    {
        problems.push(format!("the VDI changed: {info}"));
    }
    if info["settled_generation"].as_u64() < info["lock_generation"].as_u64() {
        problems.push(format!(
            "the post-crash repair is not recorded: settled_generation {} < lock_generation {}",
            info["settled_generation"], info["lock_generation"]
        ));
    }
    let list = site.json(2, &["vdi", "list", "--json"]);
    if list.as_array().map(|l| l.len()) != Some(1) {
        problems.push(format!("vdi list: {list}"));
    }
    let map_whole = |s: &Value| {
        let nodes = s["map"]["nodes"].as_object().cloned().unwrap_or_default();
        nodes.len() == 3
            && (1..=3).all(|i| {
                let n = &nodes[&i.to_string()];
                n["zone"] == format!("z{i}") && n["state"] == "up"
            })
    };
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s = site.json(0, &["cluster", "status", "--json"]);
        if map_whole(&s) || Instant::now() > end {
            break s;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if !map_whole(&status) {
        problems.push(format!("the map after 60 s: {}", status["map"]));
    }
    // And it takes writes again, through another node, read back through a third.
    let wrote = try_qemu_io(
        &site.nodes[(via + 1) % 3].uri(VDI),
        &["write -P 0x5a 0 64k".into(), "flush".into()],
    )
    .and_then(|_| {
        try_qemu_io(
            &site.nodes[(via + 2) % 3].uri(VDI),
            &["read -P 0x5a 0 64k".into()],
        )
    });
    if let Err(e) = wrote {
        problems.push(format!("writing after the restart: {e}"));
    }
    if !problems.is_empty() {
        site.copy_logs();
    }
    // Objects in which recovery sealed blocks that every copy failed (a write cut
    // from every disk at once): read from the nodes' logs, for the summary.
    let logged = |what: &str| -> usize {
        site.nodes
            .iter()
            .map(|n| {
                std::fs::read_to_string(Path::new(&n.data).join("node.log"))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains(what))
                    .count()
            })
            .sum()
    };
    let sealed = logged("sealed as this copy holds them");
    // Every host booted anew: a node whose record says it was clean compares its
    // copies before serving them (replica's catchup.rs), and says so.
    let rebooted = logged("the host booted since this node recorded its clean epoch");
    site.down();
    drop(site);
    held.release();
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    Ok(format!(
        "{} durable writes in the ack log ({fua} FUA, {} FLUSH), {} blocks checked ({} hold a later write, {} a mix of writes by sector; {sealed} object copies had blocks torn on every copy sealed); {rebooted} of 3 nodes distrusted a clean epoch of another boot; read through node {}; restart {:.1?}, run {:.1?}",
        acks.len(),
        acks.len() - fua,
        v.acked,
        v.later,
        v.mixed,
        via + 1,
        restarted,
        started.elapsed()
    ))
}

#[test]
fn test_power_loss_of_the_whole_site_keeps_every_durable_write() {
    if require_ok(outage::probe()).is_none() {
        return;
    }
    let cuts = env_u64("POWER_LOSS_CUTS").unwrap_or(4) as usize;
    let seed = env_u64("POWER_LOSS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            % 1_000_000
    });
    let work = tempfile::tempdir().unwrap();
    // A kept recording replayed where it was made (its nodes' configuration names
    // that directory), or a new one.
    let replay = std::env::var_os("POWER_LOSS_REPLAY").map(PathBuf::from);
    let dir = replay.clone().unwrap_or_else(|| work.path().to_path_buf());
    let mnt = dir.join("mnt");
    let summary = if let Some(kept) = &replay {
        let writes = env_u64("POWER_LOSS_WRITES").expect(
            "POWER_LOSS_REPLAY needs POWER_LOSS_WRITES (writes=N in the kept run's output)",
        );
        format!("writes={writes} (replayed from {})", kept.display())
    } else {
        outage::make_image(&dir.join("base"), IMAGE_MIB);
        // The base image: a stopped cluster with one VDI of 3 copies.
        let held = Held::plain(&dir.join("base"), &mnt, &dir.join("prepare.log"));
        let site = Site::create(&mnt.join("c"), &dir.join("prepare-logs"));
        let o = site.drove(0, &["vdi", "create", VDI, "32M", "--copies", "3"]);
        assert!(o.status.success(), "vdi create: {}", text(&o));
        site.down();
        drop(site);
        held.release();
        record(&dir, &mnt, seed)
    };
    // The workload's writes are numbered 1 to N ("writes=N" in its summary).
    let max_seq: u64 = summary
        .split_whitespace()
        .find_map(|w| w.strip_prefix("writes="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no writes=N in the workload's summary: {summary}"));
    let changes = outage::changes(&dir);
    let syncs = changes.iter().filter(|c| **c == Change::Sync).count();
    eprintln!(
        "power loss: seed {seed}; recorded {} writes and {syncs} syncs of the image; workload: {summary}",
        changes.len() - syncs
    );
    let mut plan = plan(&changes, cuts, &mut Rng(seed));
    if let Ok(filter) = std::env::var("POWER_LOSS_FILTER") {
        // One cut of a failed run, by the filter it printed.
        plan = vec![Cut {
            what: format!("the cut of filter {filter}"),
            filter,
        }];
    }
    let mut failed = Vec::new();
    for (k, cut) in plan.iter().enumerate() {
        let res =
            std::panic::catch_unwind(AssertUnwindSafe(|| run_cut(&dir, &mnt, k, cut, max_seq)));
        let res = res.unwrap_or_else(|e| {
            Err(e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default())
        });
        match res {
            Ok(line) => eprintln!("run {k} ({}): pass: {line}", cut.what),
            Err(why) => {
                eprintln!(
                    "run {k} ({}): FAIL (filter {}): {why}",
                    cut.what, cut.filter
                );
                failed.push(format!("run {k}, filter {}: {why}", cut.filter));
            }
        }
    }
    let cuts = plan.len();
    if !failed.is_empty() {
        let kept = if replay.is_some() {
            dir.clone()
        } else {
            work.keep()
        };
        panic!(
            "{} of {cuts} power-loss runs failed (seed {seed}; image, recording and node logs kept in {}):\n{}",
            failed.len(),
            kept.display(),
            failed.join("\n")
        );
    }
    eprintln!("power loss: {cuts} of {cuts} runs pass (seed {seed})");
}

/// The check of a block that is no whole write: a mix by sector of its newest
/// durable write and a later one passes; a sector of an older write, zeros where a
/// durable write was, or bytes no write put there do not.
#[test]
fn test_a_block_mixed_by_sector_is_told_from_a_lost_write() {
    let off = 3 * BLOCK as u64;
    let old = expected_block(off, 5, 1, 0);
    let new = expected_block(off, 9, 2, 1);
    let mut mixed = new.clone();
    mixed[3072..].copy_from_slice(&old[3072..]);
    assert!(decode_block(off, &mixed).is_err());
    let secs = sectors_of(off, &mixed, 20).unwrap();
    let want: Vec<Option<u64>> = [9, 9, 9, 9, 9, 9, 5, 5].into_iter().map(Some).collect();
    assert_eq!(secs, want);
    assert!(sectors_keep(&secs, Some(5)));
    assert!(
        !sectors_keep(&secs, Some(9)),
        "durable write 9's tail is lost"
    );
    assert!(sectors_keep(&secs, None));
    let mut zeros = new.clone();
    zeros[512..1024].fill(0);
    let secs = sectors_of(off, &zeros, 20).unwrap();
    assert!(!sectors_keep(&secs, Some(9)));
    assert!(sectors_keep(&secs, None));
    let mut foreign = new.clone();
    foreign[700] ^= 1;
    assert!(sectors_of(off, &foreign, 20).is_none());
    // Another block's write is foreign here too.
    assert!(sectors_of(off + BLOCK as u64, &new, 20).is_none());
}
