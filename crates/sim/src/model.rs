//! The model the simulator runs drove's code on: the cluster's shape, the network's
//! latencies and bandwidth, and the cost of serving a request. These are parameters,
//! printed with every result: the simulator measures what drove's code does with
//! them, not what a given machine would.
use serde::Serialize;
use std::time::Duration;

/// The simulated cluster and its costs.
#[derive(Debug, Clone, Serialize)]
pub struct Model {
    /// Datacenters ("zones").
    pub zones: usize,
    /// drove nodes in each zone.
    pub nodes_per_zone: usize,
    /// Copies of each VDI's objects.
    pub copies: u8,
    /// One-way delay between two zones.
    #[serde(with = "micros")]
    pub zone_delay: Duration,
    /// One-way delay between two nodes of a zone.
    #[serde(with = "micros")]
    pub local_delay: Duration,
    /// Each node's network link, bytes per second in each direction.
    pub nic_bytes_per_s: u64,
    /// Each node's disk, bytes per second (requests served for peers pay it).
    pub disk_bytes_per_s: u64,
    /// Fixed cost of one request served for a peer (CPU and disk), besides its bytes.
    #[serde(with = "micros")]
    pub serve_cost: Duration,
    /// Fixed cost of one client operation at its gateway node (on the same queue as
    /// the requests it serves for peers: one queue per node for CPU and disk).
    #[serde(with = "micros")]
    pub client_cost: Duration,
    /// How long a request to a node that does not answer (cut off, or its host
    /// gone) waits before the caller gives it up as silent.
    #[serde(with = "micros")]
    pub give_up: Duration,
    /// The longest any request waits for its answer, from a node that answers
    /// (the peer pool's request timeout).
    #[serde(with = "micros")]
    pub request_timeout: Duration,
    /// How long a node stays unreachable before the metadata marks it down.
    #[serde(with = "micros")]
    pub down_after: Duration,
    /// Whether the failure detector sends a round's verdicts as one command (one
    /// epoch, as drove does since `JudgeNodes`) or one command per node (one epoch
    /// each, as it did before).
    pub batch_verdicts: bool,
    /// The metadata leader's log write for one command; a command commits after
    /// this and a round trip between zones (a majority of voters in other zones).
    #[serde(with = "micros")]
    pub meta_log_write: Duration,
    /// A node's cost per object it lists for a `List` request (a directory walk),
    /// on the same queue as the requests it serves.
    #[serde(with = "nanos", rename = "list_per_object_ns")]
    pub list_per_object: Duration,
}

impl Default for Model {
    /// The paper's set-up: 4 datacenters of 22 nodes, 10 ms one-way between them
    /// and 0.1 ms inside, 10 Gbit/s links, disks of 1 GB/s.
    fn default() -> Self {
        Model {
            zones: 4,
            nodes_per_zone: 22,
            copies: 3,
            zone_delay: Duration::from_millis(10),
            local_delay: Duration::from_micros(100),
            nic_bytes_per_s: 1_250_000_000,
            disk_bytes_per_s: 1_000_000_000,
            serve_cost: Duration::from_micros(20),
            client_cost: Duration::from_micros(20),
            give_up: Duration::from_secs(2),
            request_timeout: drove_replica::PeerTimeouts::default().request,
            down_after: Duration::from_secs(3),
            batch_verdicts: true,
            meta_log_write: Duration::from_millis(1),
            list_per_object: Duration::from_nanos(LIST_NS_PER_OBJECT),
        }
    }
}

/// A `List`'s cost per object, in nanoseconds: FileStore's directory walk on this
/// machine (see `docs/simulator.md`, "Costs measured on this machine").
const LIST_NS_PER_OBJECT: u64 = 1_000;

impl Model {
    /// The time a metadata command takes to commit: the leader's log write and a
    /// round trip to a majority in other zones. The failure detector's verdicts,
    /// and every command a node sends, wait this long; commands from one sender
    /// wait in turn.
    pub fn commit_time(&self) -> Duration {
        self.zone_delay * 2 + self.meta_log_write
    }

    /// Nodes in all.
    pub fn nodes(&self) -> usize {
        self.zones * self.nodes_per_zone
    }

    /// The zone (0-based) of node `id` (1-based, numbered zone by zone).
    pub fn zone_of(&self, id: u64) -> usize {
        (id.saturating_sub(1) as usize / self.nodes_per_zone.max(1)).min(self.zones.max(1) - 1)
    }

    /// The zone's name, as a node of it would give it: z1, z2, ...
    pub fn zone_name(zone: usize) -> String {
        format!("z{}", zone + 1)
    }

    /// The one-way delay between zones `a` and `b`.
    pub fn delay(&self, a: usize, b: usize) -> Duration {
        if a == b {
            self.local_delay
        } else {
            self.zone_delay
        }
    }

    /// The time `bytes` take on a link of `per_s` bytes per second.
    pub fn wire_time(bytes: u64, per_s: u64) -> Duration {
        if per_s == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(
            u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(per_s))
                .unwrap_or(u64::MAX),
        )
    }

    /// The parameters as lines for a report.
    pub fn describe(&self) -> Vec<String> {
        vec![
            format!(
                "{} zones x {} nodes, {} copies",
                self.zones, self.nodes_per_zone, self.copies
            ),
            format!(
                "one-way delay {:?} between zones, {:?} inside a zone",
                self.zone_delay, self.local_delay
            ),
            format!(
                "links {} MB/s per node and direction; disks {} MB/s; {:?} per request served, {:?} per client operation",
                self.nic_bytes_per_s / 1_000_000,
                self.disk_bytes_per_s / 1_000_000,
                self.serve_cost,
                self.client_cost
            ),
            format!(
                "a silent node is given up after {:?} and marked down after {:?}; any request after {:?}",
                self.give_up, self.down_after, self.request_timeout
            ),
            format!(
                "a metadata command commits after {:?} (a round trip between zones and a {:?} log write); a List costs {:?} per object listed; a digest reads what it covers on the serving node's disk",
                self.commit_time(),
                self.meta_log_write,
                self.list_per_object
            ),
            "the clock ticks every 1 ms (tokio's timer): a wait ending between two ticks ends on one of them at random, keeping its mean".to_string(),
        ]
    }
}

mod nanos {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

mod micros {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}
