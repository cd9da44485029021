//! `drove sim faults`: seeded runs of a small cluster under faults, and the
//! invariants checked after each.
//!
//! A run: clients (VMs) write and read 4 KiB blocks of their VDIs (sync and
//! zone-sync) through their node's gateway, each block written with its VDI, index
//! and a sequence number, while faults come one after the other: a node crashes
//! and restarts, a zone is cut off and healed, a whole zone is lost and comes back,
//! a block of a replica is flipped on its disk. Then everything heals, the
//! zone-sync lanes drain, recovery finishes, every node scrubs (each copy that
//! fails its checksums must be repaired by it, and a second scrub must find none),
//! the replicas of VMs whose writer stopped are settled, every node scrubs again
//! (finding none), and the run checks:
//! - no acknowledged write is lost: every block holds its last acknowledged write
//!   or a later one (sync: always; zone-sync: an acknowledgement is exempt only when
//!   a fault was under way in its home zone at some time within the VDI's lag bound
//!   after it, when the write could still be unshipped);
//! - no read, during the run or after, returns data that was never written;
//! - a sync read never returns a block older than its last acknowledged write;
//! - every object has `copies` identical replicas (`vdi check`);
//! - every acknowledged write was made under the VDI's current lock generation
//!   held by the writer's node (one writer per VDI at a time).
//!
//! Everything a run does follows from its seed and the simulated clock: the same
//! seed prints the same report, byte for byte.
//!
//! This file is the run (set-up, the heal at its end, the report); the faults come
//! from [`inject`], the VMs are [`clients`], and the checks are [`invariants`].
use drove_types::{NodeId, WritePolicy};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::cluster::{Disks, MetaMode, SimCluster};
use crate::model::Model;
use crate::rng::Rng;

mod clients;
mod inject;
mod invariants;

use clients::*;
use inject::*;
use invariants::*;

/// What a fault run is made of.
#[derive(Debug, Clone, Serialize)]
pub struct FaultOpts {
    /// Zones.
    pub zones: usize,
    /// Nodes per zone.
    pub nodes_per_zone: usize,
    /// VDIs (one client each), half sync and half zone-sync.
    pub vdis: usize,
    /// Simulated seconds the clients run.
    pub secs: u64,
    /// Before the checks, delete one acknowledged block's object from every
    /// replica: a run that must fail (the test that the checks can).
    #[serde(skip)]
    pub sabotage: bool,
    /// Make every disk's flush succeed without making anything durable: a run
    /// with power losses that must fail (the test that the durability check can).
    #[serde(skip)]
    pub sabotage_flush: bool,
    /// The kinds of fault injected.
    pub kinds: Vec<FaultKind>,
    /// The metadata: the model, or openraft on every node.
    pub meta: MetaMode,
}

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A node crashes and restarts on its disk.
    Crash,
    /// A zone is cut off from the others, then healed.
    Cut,
    /// Every node of a zone crashes, then restarts.
    Lose,
    /// A block of a replica flips on its disk.
    Flip,
    /// A node, a zone or the whole site loses power: what was not flushed is
    /// lost, but for blocks written back on their own, torn at block granularity.
    Power,
    /// A block of a node's disk reads EIO (a latent sector error).
    Eio,
    /// A node's next fsync fails, forgetting the pages it did not write.
    FsyncFail,
    /// A node's disk fills up.
    Enospc,
    /// A node's disk takes seconds per fsync.
    SlowDisk,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Crash,
        FaultKind::Cut,
        FaultKind::Lose,
        FaultKind::Flip,
        FaultKind::Power,
        FaultKind::Eio,
        FaultKind::FsyncFail,
        FaultKind::Enospc,
        FaultKind::SlowDisk,
    ];

    /// The kind named `s` (crash, cut, lose, flip, power, eio, fsync-fail,
    /// enospc, slow-disk).
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::Cut => "cut",
            FaultKind::Lose => "lose",
            FaultKind::Flip => "flip",
            FaultKind::Power => "power",
            FaultKind::Eio => "eio",
            FaultKind::FsyncFail => "fsync-fail",
            FaultKind::Enospc => "enospc",
            FaultKind::SlowDisk => "slow-disk",
        }
    }
}

impl Default for FaultOpts {
    fn default() -> Self {
        FaultOpts {
            zones: 3,
            nodes_per_zone: 3,
            vdis: 4,
            secs: 40,
            sabotage: false,
            sabotage_flush: false,
            kinds: FaultKind::ALL.to_vec(),
            meta: MetaMode::Model,
        }
    }
}

const BLOCK: usize = 4096;
/// Objects of the fault runs' VDIs: small, so that blocks share objects.
const OBJECT_SIZE: u32 = 256 << 10;
/// Blocks each VDI writes (spread over its objects).
const BLOCKS: u64 = 96;
/// The VMs' lock lease (their nodes' lock service's).
const LEASE: Duration = crate::cluster::LOCK_LEASE;
/// A client operation that has not ended by then counts as failed (its outcome is
/// unknown: the block may or may not hold it).
const OP_TIMEOUT: Duration = Duration::from_secs(30);
const MAGIC: u64 = 0x4452_4f56_4553_494d; // "DROVESIM"

/// One run's result.
#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// The faults injected, in order, with their simulated times.
    pub faults: Vec<String>,
    /// Writes acknowledged.
    pub acked: u64,
    /// Writes that failed or did not end (outcome unknown).
    pub failed: u64,
    /// Reads whose data was checked.
    pub reads: u64,
    /// Epochs the metadata went through.
    pub epochs: u64,
    /// Copies the scrubs after the heal found failing their checksums.
    pub scrub_corrupt: u64,
    /// Of those, copies the scrubs repaired.
    pub scrub_repaired: u64,
    /// Simulated seconds from the start to the end of the checks.
    pub sim_secs: f64,
    /// Broken invariants; empty when the run passed.
    pub violations: Vec<String>,
}

impl SeedReport {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Simulated time a run may take past its clients' `secs` before it counts as
/// hung. A run ends about 20 s after its clients (heal, scrubs, settles, checks).
pub const SEED_LIMIT: Duration = Duration::from_secs(600);

/// Run seed `seed`; a run that has not ended within [`SEED_LIMIT`] past its
/// clients' time fails, with its seed (see [`run_seed_within`]).
pub fn run_seed(seed: u64, opts: &FaultOpts) -> anyhow::Result<SeedReport> {
    run_seed_within(seed, opts, Duration::from_secs(opts.secs) + SEED_LIMIT)
}

/// Run seed `seed`, failing it when it has not ended after `limit` of simulated
/// time. Seed 3397 once never ended (a client waited for a call to a crashed node,
/// fix 18), and a 10,000-seed run waited for it with no word of which seed it was.
pub fn run_seed_within(seed: u64, opts: &FaultOpts, limit: Duration) -> anyhow::Result<SeedReport> {
    let rt = crate::runtime()?;
    // Every random number drove's code draws on this thread (a run's incarnation,
    // request ids, openraft's election timeouts) follows the seed.
    drove_types::random::seed_thread(seed);
    let report = rt.block_on(async {
        match tokio::time::timeout(limit, run(seed, opts.clone())).await {
            Ok(report) => report,
            Err(_) => {
                let mut r = failed_setup(
                    seed,
                    format!(
                        "the run did not end within {} s of simulated time: a hang (a task waiting for something that never comes)",
                        limit.as_secs()
                    ),
                );
                r.sim_secs = limit.as_secs_f64();
                r
            }
        }
    });
    // The dead runs' tasks end with the runtime, still on the seeded thread.
    drop(rt);
    drove_types::random::unseed_thread();
    Ok(report)
}

/// One write of a block: its number, when it was acknowledged, and whether it is
/// durable (written with FUA, or acknowledged before an acknowledged flush).
#[derive(Debug, Clone)]
struct Rec {
    seq: u64,
    acked_at: Option<Instant>,
    durable: bool,
    /// The nodes the map placed the block's object on (and had up) when the
    /// write was acknowledged: the copies that took it.
    holders: Vec<NodeId>,
}

/// Nodes whose page cache, or whole disk, was lost at an instant: a power loss
/// (what was not flushed is gone) or a replaced disk (everything is).
#[derive(Debug, Clone)]
struct Loss {
    at: Instant,
    nodes: Vec<NodeId>,
}

/// Whether write `r` of the VM on node `vm` may be gone without any fault of
/// drove's: it is not durable, and since it was acknowledged either every copy
/// that took it lost its page cache, or the VM's own host lost power (the VM died
/// with it, and what it never flushed it may not find again: a disk's promise).
fn lost_with_power(r: &Rec, losses: &[Loss], vm: NodeId) -> bool {
    let Some(t) = r.acked_at else { return true };
    let lost = |n: &NodeId| losses.iter().any(|l| l.at >= t && l.nodes.contains(n));
    !r.durable && ((!r.holders.is_empty() && r.holders.iter().all(lost)) || lost(&vm))
}

/// What a client did, for the checks.
#[derive(Default)]
struct Book {
    blocks: BTreeMap<u64, Vec<Rec>>,
    acked: u64,
    failed: u64,
    reads: u64,
    violations: Vec<String>,
}

struct Client {
    name: String,
    node: NodeId,
    policy: WritePolicy,
    book: Mutex<Book>,
    losses: Arc<Mutex<Vec<Loss>>>,
}

/// A fault's window on a zone, for the zone-sync exemption.
#[derive(Debug, Clone, Copy)]
struct Hit {
    zone: usize,
    at: Instant,
    until: Instant,
}

async fn run(seed: u64, opts: FaultOpts) -> SeedReport {
    let mut rng = Rng::new(seed);
    let model = Model {
        zones: opts.zones,
        nodes_per_zone: opts.nodes_per_zone,
        copies: 3u8.min(u8::try_from(opts.zones * opts.nodes_per_zone).unwrap_or(u8::MAX)),
        ..Model::default()
    };
    let cluster =
        match SimCluster::with_meta(model.clone(), OBJECT_SIZE, Disks::Memory, opts.meta).await {
            Ok(c) => c,
            Err(e) => return failed_setup(seed, format!("the cluster did not start: {e}")),
        };
    if opts.sabotage_flush {
        for id in cluster.node_ids() {
            if let Some(m) = cluster.node(id).and_then(|n| n.mem.clone()) {
                m.pretend_flushes();
            }
        }
    }
    let losses: Arc<Mutex<Vec<Loss>>> = Arc::default();
    let start = Instant::now();
    let n = model.nodes() as u64;
    let mut clients = Vec::new();
    for i in 0..opts.vdis {
        let node = NodeId(1 + rng.below(n));
        let policy = if i % 2 == 0 {
            WritePolicy::Sync
        } else {
            WritePolicy::ZoneSync
        };
        let name = format!("vm{i}");
        let size = BLOCKS * BLOCK as u64 * 4;
        if let Err(e) = cluster
            .create_vdi(&name, size, Some(model.zone_of(node.0)), policy)
            .await
        {
            return failed_setup(seed, format!("cannot create VDI {name}: {e}"));
        }
        clients.push(Arc::new(Client {
            name,
            node,
            policy,
            book: Mutex::new(Book::default()),
            losses: losses.clone(),
        }));
    }
    let end = start + Duration::from_secs(opts.secs);
    let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
    let detector = {
        let c = cluster.clone();
        tokio::spawn(async move {
            let mut since = BTreeMap::new();
            loop {
                c.detect(&mut since).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut handles = Vec::new();
    for (i, cl) in clients.iter().enumerate() {
        let (c, cl) = (cluster.clone(), cl.clone());
        let r = Rng::new(seed ^ (0x5eed_0000 + i as u64));
        handles.push(tokio::spawn(client(c, cl, r, end)));
    }
    let faults = {
        let power = opts.kinds.contains(&FaultKind::Power);
        let mut inj = Injector::new(&cluster, &hits, &losses, start, power);
        inj.run(&mut rng, end, &opts.kinds).await;
        inj.out
    };
    for h in handles {
        let _ = h.await;
    }
    let mut violations = Vec::new();
    // The failure detector runs to the end, as it does in a cluster: a gateway's
    // request sent into a cut and timing out after the heal marks live nodes down
    // after heal() found the cluster whole, and only the detector marks them up
    // again (with it stopped here, `drove sim faults --seed 353 --time 40s` read
    // from an object whose every copy stayed down).
    let scrubbed = heal(&cluster, &mut violations, &clients).await;
    if opts.sabotage {
        sabotage(&cluster, &clients);
    }
    let hits = hits.lock().clone();
    let losses = losses.lock().clone();
    let mut acked = 0;
    let mut failed = 0;
    let mut reads = 0;
    for cl in &clients {
        let (a, f, r) = final_check(&cluster, cl, (&hits, &losses), &mut violations).await;
        acked += a;
        failed += f;
        reads += r;
    }
    detector.abort();
    SeedReport {
        seed,
        faults,
        acked,
        failed,
        reads,
        epochs: cluster.epoch(),
        scrub_corrupt: scrubbed.corrupt,
        scrub_repaired: scrubbed.repaired,
        sim_secs: start.elapsed().as_secs_f64(),
        violations,
    }
}

/// Delete the object of one acknowledged block from every node.
fn sabotage(c: &SimCluster, clients: &[Arc<Client>]) {
    for cl in clients {
        let Some(vdi) = c.vdi(&cl.name) else { continue };
        let block = cl
            .book
            .lock()
            .blocks
            .iter()
            .find(|(_, recs)| recs.iter().any(|r| r.acked_at.is_some()))
            .map(|(b, _)| *b);
        if let Some(block) = block {
            let (oid, _) = place(&vdi, block);
            for id in c.node_ids() {
                if let Some(n) = c.node(id) {
                    let _ = drove_objstore::ObjectStore::delete(n.store.as_ref(), oid);
                }
            }
            return;
        }
    }
}

fn failed_setup(seed: u64, why: String) -> SeedReport {
    SeedReport {
        seed,
        faults: vec![],
        acked: 0,
        failed: 0,
        reads: 0,
        epochs: 0,
        scrub_corrupt: 0,
        scrub_repaired: 0,
        sim_secs: 0.0,
        violations: vec![why],
    }
}

/// Heal everything, and wait until the cluster is whole: every node up in the
/// map (the failure detector, still running, marks returning nodes up), the
/// zone-sync lanes drained, recovery clean everywhere. Then every node scrubs
/// (twice: the second finds nothing), the stopped VMs' replicas are settled, and
/// every node scrubs again. What the scrubs found and repaired, summed.
///
/// The first scrub comes before the settle: the settle compares the copies by
/// reading them and repairs a flipped copy itself, so a scrub after it only ever
/// found clean copies, and a scrub that reported a repair while keeping the
/// flipped bytes (e2e_heal's scrub tests, fixed in 0e5f35b) passed every seed.
async fn heal(
    c: &Arc<SimCluster>,
    violations: &mut Vec<String>,
    clients: &[Arc<Client>],
) -> drove_replica::ScrubReport {
    let mut scrubbed = drove_replica::ScrubReport::default();
    for z in 0..c.model().zones {
        c.net.set_cut(z, false);
    }
    for id in c.node_ids() {
        if !c.net.is_up(id) {
            c.restart(id).await;
        }
    }
    c.publish();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let st = c.state();
        let all_up = st
            .map
            .nodes
            .values()
            .all(|n| n.state == drove_types::NodeState::Up);
        let clean = c.node_ids().into_iter().all(|id| {
            c.node(id).is_some_and(|n| {
                let p = n.recoverer.progress();
                p.clean && p.epoch == st.map.epoch.0
            })
        });
        if all_up && clean {
            break;
        }
        if Instant::now() >= deadline {
            violations.push(format!(
                "the cluster was not whole 120 s after the faults healed (all up: {all_up}, recovery clean: {clean})"
            ));
            return scrubbed;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for cl in clients {
        let (Some(node), Some(vdi)) = (c.node(cl.node), c.vdi(&cl.name)) else {
            continue;
        };
        match tokio::time::timeout(Duration::from_secs(60), node.gateway.drain(&vdi)).await {
            Ok(Ok(())) => {}
            // A lane of a crashed incarnation is gone with it; what it owed is the
            // recovery's (and the exemption's) business.
            Ok(Err(e)) => tracing::debug!(vdi = %cl.name, "drain: {e}"),
            Err(_) => violations.push(format!("VDI {}: the zone-sync lane did not drain", cl.name)),
        }
    }
    // Every copy a scrub finds failing its checksums it must repair: the cluster is
    // whole, so a good copy is up. A second scrub must find none (a repair that
    // kept the flipped bytes reports itself done).
    scrub_all(c, violations, &mut scrubbed, "before the settle", false).await;
    scrub_all(c, violations, &mut scrubbed, "after the first", true).await;
    // The VMs stop without a clean release (as from a crash): another node of each
    // home zone takes the lock once the lease ran out and settles the replicas, as
    // a VM started elsewhere does.
    //
    // A new metadata leader extends every lease by its length and a margin, as it
    // cannot know what its predecessor confirmed (`MetaState::new_term`): the taker
    // waits that long, and once more when a term began meanwhile. Taken after one
    // lease, three seeds failed after voters moved at the heal (`drove sim faults
    // --seed 441 --time 20s --meta raft`: "lease for 654 ms more" on every VDI).
    let extension = LEASE + Duration::from_millis(drove_meta::NEW_LEADER_MARGIN_MS);
    let term = c.state().lease_term;
    tokio::time::sleep(extension + Duration::from_secs(1)).await;
    for cl in clients {
        let zone = c.model().zone_of(cl.node.0);
        let ids = c.node_ids();
        let other = ids
            .iter()
            .copied()
            .find(|&id| id != cl.node && c.model().zone_of(id.0) == zone)
            .or_else(|| ids.iter().copied().find(|&id| id != cl.node))
            .unwrap_or(cl.node);
        // The daemon's lock service settles the replicas before it grants.
        let mut got = c.acquire(&cl.name, other, LEASE).await;
        if got.is_err() && c.state().lease_term > term {
            tokio::time::sleep(extension + Duration::from_secs(1)).await;
            got = c.acquire(&cl.name, other, LEASE).await;
        }
        if let Err(e) = got {
            violations.push(format!(
                "VDI {}: node {other} cannot take the lock and settle after its writer stopped: {e}",
                cl.name
            ));
        }
    }
    scrub_all(c, violations, &mut scrubbed, "after the settle", true).await;
    scrubbed
}

/// Scrub every node; a scrub that fails, or leaves a copy it found failing its
/// checksums unrepaired, or finds one at all when `clean` (no block flips any
/// more), is a violation. Adds what the scrubs found to `sum`.
async fn scrub_all(
    c: &SimCluster,
    violations: &mut Vec<String>,
    sum: &mut drove_replica::ScrubReport,
    when: &str,
    clean: bool,
) {
    for id in c.node_ids() {
        let Some(node) = c.node(id) else { continue };
        match node.recoverer.scrub().await {
            Ok(r) => {
                sum.objects += r.objects;
                sum.corrupt += r.corrupt;
                sum.repaired += r.repaired;
                if clean && r.corrupt > 0 {
                    violations.push(format!(
                        "node {id}: the scrub {when} found {} copies failing their checksums, which the scrubs before had repaired",
                        r.corrupt
                    ));
                } else if r.repaired < r.corrupt {
                    violations.push(format!(
                        "node {id}: the scrub {when} found {} copies failing their checksums and repaired {}",
                        r.corrupt, r.repaired
                    ));
                }
            }
            Err(e) => violations.push(format!("node {id}: scrub {when} failed: {e}")),
        }
    }
}
