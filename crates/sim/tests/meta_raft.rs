//! openraft in the simulator: three real metadata nodes ([`drove_meta::Meta`],
//! openraft with drove's log store and state machine on a redb file in memory)
//! talking over the simulated network. A cluster forms through production's
//! bootstrap and join, commits, elects a new leader when its leader's host
//! crashes, and the crashed node comes back with its log and vote from its disk.
//! The same seed gives the same elections at the same simulated instants.
use drove_meta::{Command, MemDisk, Meta, MetaConfig};
use drove_objstore::MemStore;
use drove_replica::catchup::CatchUp;
use drove_replica::LocalStore;
use drove_sim::metanet::SimMetaNets;
use drove_sim::net::SimNet;
use drove_sim::Model;
use drove_types::{NodeId, NodeInfo};
use std::sync::Arc;
use std::time::Duration;

fn peer(id: u64) -> String {
    format!("127.0.0.1:{}", 30_000 + id)
}

fn admin(id: u64) -> String {
    format!("127.0.0.1:{}", 20_000 + id)
}

async fn start(
    net: &Arc<SimNet>,
    nets: &Arc<SimMetaNets>,
    id: u64,
    disk: MemDisk,
    join: bool,
) -> Arc<Meta> {
    let local = LocalStore::with_catchup(Arc::new(MemStore::new(65536)), CatchUp::open(None));
    let transport = net.attach(NodeId(id), (id - 1) as usize, local);
    let cfg = MetaConfig {
        data_dir: format!("/nonexistent/sim-{id}").into(),
        addr: peer(id),
        join: join.then(|| admin(1)),
        node: NodeInfo {
            weight: 100,
            admin_addr: admin(id),
            peer_addr: peer(id),
            nbd_addr: format!("127.0.0.1:{}", 40_000 + id),
            nbd_socket: format!("/run/drove/sim-{id}.sock"),
            ..NodeInfo::new(NodeId(id), format!("z{id}"))
        },
        max_voters: 3,
        join_timeout: Duration::from_secs(60),
        tls: None,
        routes: None,
    };
    let out = nets.for_node(NodeId(id), transport.incarnation());
    // The node serves as soon as it runs: register before a join needs answers.
    let meta = Meta::open_in_memory(cfg, out, disk).await.unwrap();
    nets.register(
        &[peer(id), admin(id)],
        NodeId(id),
        transport.incarnation(),
        &meta,
    );
    meta
}

fn leader_of(metas: &[&Arc<Meta>]) -> Option<(u64, u64)> {
    metas.iter().find_map(|m| {
        let s = m.status();
        (s.leader == Some(s.node_id)).then_some((s.node_id.0, s.term))
    })
}

/// One run of the scenario; what happened, with simulated times.
fn scenario(seed: u64) -> Vec<String> {
    let rt = drove_sim::runtime().unwrap();
    drove_types::random::seed_thread(seed);
    let trace = rt.block_on(async {
        let model = Model {
            zones: 3,
            nodes_per_zone: 1,
            ..Model::default()
        };
        let net = SimNet::new(model);
        let nets = SimMetaNets::new(net.clone());
        let disks: Vec<MemDisk> = (0..3).map(|_| MemDisk::new()).collect();
        let m1 = start(&net, &nets, 1, disks[0].clone(), false).await;
        m1.ready(Duration::from_secs(30)).await.unwrap();
        let m2 = start(&net, &nets, 2, disks[1].clone(), true).await;
        let m3 = start(&net, &nets, 3, disks[2].clone(), true).await;
        m2.ready(Duration::from_secs(60)).await.unwrap();
        m3.ready(Duration::from_secs(60)).await.unwrap();
        let mut trace = Vec::new();
        let t = |trace: &mut Vec<String>, what: String| {
            let at = drove_sim::sim_time().unwrap_or_default().as_millis();
            trace.push(format!("{at} ms: {what}"));
        };
        // Wait for the voter keeper to promote both learners.
        let all = [&m1, &m2, &m3];
        for _ in 0..200 {
            if m1.status().voters.len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        t(&mut trace, format!("voters {:?}", m1.status().voters));
        for _ in 0..5 {
            m3.execute(Command::AllocateNodeId).await.unwrap();
        }
        let (old, term) = leader_of(&all).unwrap();
        t(&mut trace, format!("leader {old} term {term}"));
        // The leader's host dies; its disk stays as it was.
        net.crash(NodeId(old));
        let kept = disks[(old - 1) as usize].copy();
        let dead = all[(old - 1) as usize].clone();
        tokio::spawn(async move { dead.shutdown().await });
        let rest: Vec<&Arc<Meta>> = all
            .iter()
            .copied()
            .filter(|m| m.node_id().0 != old)
            .collect();
        let mut new = None;
        for _ in 0..100 {
            new = leader_of(&rest);
            if new.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (new, term2) = new.expect("a new leader");
        assert_ne!(new, old);
        assert!(term2 > term);
        t(&mut trace, format!("new leader {new} term {term2}"));
        rest[0].execute(Command::AllocateNodeId).await.unwrap();
        let applied = rest[0].status().last_applied_index;
        // The crashed node comes back on its disk: same id, its log, its vote.
        let back = start(&net, &nets, old, kept, false).await;
        back.ready(Duration::from_secs(30)).await.unwrap();
        back.read_barrier(Duration::from_secs(5)).await.unwrap();
        assert!(back.status().last_applied_index >= applied);
        assert!(back.status().term >= term2);
        t(
            &mut trace,
            format!(
                "node {old} back at index {:?} term {}",
                back.status().last_applied_index,
                back.status().term
            ),
        );
        trace
    });
    drop(rt);
    trace
}

#[test]
fn test_real_metadata_raft_elects_commits_and_recovers_over_the_simulated_network() {
    let a = std::thread::spawn(|| scenario(7)).join().unwrap();
    assert_eq!(a.len(), 4, "{a:#?}");
    // The same seed: the same elections at the same simulated instants.
    let b = std::thread::spawn(|| scenario(7)).join().unwrap();
    assert_eq!(a, b);
}
