//! A replication stack per node, in one process: real TCP on 127.0.0.1 and real
//! file stores, each node's catalog published as the daemon would from metadata.
#![allow(dead_code)]

use bytes::Bytes;
use drove_metrics::Metrics;
use drove_objstore::{FileStore, ObjectStore};
use drove_proto::{Speaker, WireRange};
use drove_replica::{Catalog, Gateway, LocalStore, MapCell, PeerPool, PeerServer, PeerTimeouts};
use drove_types::{
    ClusterId, ClusterMap, Epoch, NodeId, NodeInfo, ReplicationMode, VdiId, VdiInfo,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The cluster every test node belongs to.
pub const CLUSTER: ClusterId = ClusterId(0xd20e);

/// The VDI ids the tests write: 7 (see [`vdi`]), 20 and 21 (both modes); all exist,
/// with lock generation 1 handed out.
pub const VDI_IDS: [u32; 3] = [7, 20, 21];

pub struct TestNode {
    pub id: NodeId,
    pub store: Arc<dyn ObjectStore>,
    pub local: Arc<LocalStore>,
    pub gateway: Arc<Gateway>,
    pub pool: Arc<PeerPool>,
    pub map: Arc<MapCell>,
    pub metrics: Arc<Metrics>,
    pub server: tokio::task::JoinHandle<()>,
    pub _dir: tempfile::TempDir,
}

pub async fn cluster(n: u64) -> Vec<TestNode> {
    cluster_at(n, None).await
}

/// Like [`cluster`]; with `caught_up`, each node's store is gated by recovery's
/// catch-up state, caught up with that epoch (requests from older epochs are
/// refused, as on a real node), instead of taking every epoch.
pub async fn cluster_at(n: u64, caught_up: Option<Epoch>) -> Vec<TestNode> {
    let timeouts = PeerTimeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(3),
        ..Default::default()
    };
    cluster_with(n, caught_up, timeouts).await
}

/// Like [`cluster_at`], with each node's pool waiting on its peers as `timeouts` say.
pub async fn cluster_with(
    n: u64,
    caught_up: Option<Epoch>,
    timeouts: PeerTimeouts,
) -> Vec<TestNode> {
    let wire = vec![WireRange::BUILD; n as usize];
    cluster_speaking(&wire, caught_up, timeouts).await
}

/// Like [`cluster_with`], one node per entry of `wire`, node `i + 1` speaking the
/// wire versions `wire[i]` (an older build, or one that dropped an old version).
pub async fn cluster_speaking(
    wire: &[WireRange],
    caught_up: Option<Epoch>,
    timeouts: PeerTimeouts,
) -> Vec<TestNode> {
    let n = wire.len() as u64;
    let mut listeners = Vec::new();
    let mut nodes = BTreeMap::new();
    for i in 1..=n {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        nodes.insert(
            NodeId(i),
            NodeInfo {
                weight: 100,
                peer_addr: addr,
                ..NodeInfo::new(NodeId(i), format!("z{i}"))
            },
        );
        listeners.push(l);
    }
    let map = ClusterMap {
        epoch: Epoch(1),
        nodes,
    };
    let mut out = Vec::new();
    for (i, l) in (1..=n).zip(listeners) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(FileStore::open(dir.path(), 4 << 20).unwrap());
        let metrics = Metrics::new();
        let cell = Arc::new(MapCell::new(map.clone()));
        let speaker = Speaker {
            wire: wire[i as usize - 1],
            ..Speaker::new(CLUSTER, NodeId(i))
        };
        let pool = PeerPool::speaking(speaker, cell.clone(), timeouts, metrics.clone(), None);
        let local = match caught_up {
            None => LocalStore::new(store.clone()),
            Some(epoch) => {
                let c = drove_replica::catchup::CatchUp::open(None);
                c.install(epoch, Default::default());
                LocalStore::with_catchup(store.clone(), c)
            }
        };
        let gateway = Gateway::new(
            NodeId(i),
            local.clone(),
            pool.clone(),
            cell.clone(),
            metrics.clone(),
        );
        local.catalog().publish(catalog(&map, &[]));
        let server = tokio::spawn(
            PeerServer::new(local.clone(), pool.clone(), metrics.clone(), CLUSTER).serve(l),
        );
        out.push(TestNode {
            id: NodeId(i),
            store,
            local,
            gateway,
            pool: pool.clone(),
            map: cell,
            metrics,
            server,
            _dir: dir,
        });
    }
    out
}

pub fn vdi(mode: ReplicationMode) -> VdiInfo {
    VdiInfo {
        mode,
        ..VdiInfo::new(VdiId(7), "t", 64 << 20, 4 << 20, 3)
    }
}

/// The value of the metric line `name` (with its labels) in `text`, if there is one.
pub fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// [`metric`], 0 when the line is missing (a counter never incremented).
pub fn count(text: &str, name: &str) -> u64 {
    metric(text, name).unwrap_or(0)
}

pub fn pattern(seed: u8, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| seed.wrapping_add((i % 251) as u8))
            .collect::<Vec<_>>(),
    )
}

/// The catalog of `map` with the test VDIs, generation 1 handed out for each except
/// where `gens` says otherwise.
pub fn catalog(map: &ClusterMap, gens: &[(VdiId, u64)]) -> Catalog {
    let mut generations: BTreeMap<VdiId, u64> = VDI_IDS.iter().map(|&i| (VdiId(i), 1)).collect();
    generations.extend(gens.iter().copied());
    Catalog {
        map: Arc::new(map.clone()),
        vdis: Arc::new(
            VDI_IDS
                .iter()
                .map(|&i| {
                    let v = VdiInfo {
                        id: VdiId(i),
                        ..vdi(ReplicationMode::Direct)
                    };
                    (v.id, v)
                })
                .collect(),
        ),
        next_vdi_id: 100,
        generations,
    }
}

/// Publish to `nodes` the catalog of their current map with generations `gens`.
pub fn publish(nodes: &[TestNode], gens: &[(VdiId, u64)]) {
    for n in nodes {
        n.local.catalog().publish(catalog(&n.map.get(), gens));
    }
}
