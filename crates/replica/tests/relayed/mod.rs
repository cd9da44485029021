//! Test clusters whose nodes are each reached through a freezable relay
//! (for the test crates that have both `common` and `relay`).
#![allow(dead_code)]

use crate::common::{cluster_with, publish, TestNode};
use crate::relay::Relay;
use std::sync::Arc;

/// A cluster of one node per zone in `zones`, every node reached through its own
/// relay (by its peers too), on map epoch 2, with the test catalog published.
pub async fn relayed_cluster(
    zones: &[&str],
    timeouts: drove_replica::PeerTimeouts,
) -> (Vec<TestNode>, Vec<Relay>) {
    let nodes = cluster_with(zones.len() as u64, None, timeouts).await;
    let mut map = (*nodes[0].map.get()).clone();
    map.epoch = drove_types::Epoch(2);
    let mut relays = Vec::new();
    for (n, zone) in nodes.iter().zip(zones) {
        let info = map.nodes.get_mut(&n.id).unwrap();
        let relay = Relay::start(info.peer_addr.parse().unwrap()).await;
        info.peer_addr = relay.addr.to_string();
        info.zone = zone.to_string();
        relays.push(relay);
    }
    let map = Arc::new(map);
    for n in &nodes {
        n.map.set(map.clone());
    }
    publish(&nodes, &[]);
    (nodes, relays)
}
