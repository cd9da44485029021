//! Reads of a VDI whose home zone just moved, over real TCP: while every replica
//! placed under the new home answers "recovering", the read is served by a copy
//! placed under the previous home, and counted as such.
mod common;

use common::*;
use drove_placement::{locate_before_move, locate_vdi};
use drove_types::{ClusterMap, Epoch, ObjectId, PastHome, ReplicationMode, VdiInfo};
use std::collections::HashSet;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_read_while_the_new_holders_recover_is_served_by_a_copy_placed_before_the_move() {
    // Four nodes: 1 and 2 in zone a, 3 and 4 in zone b. The VDI's two copies live
    // in zone a first.
    let nodes = cluster_at(4, Some(Epoch(1))).await;
    let mut map1 = (*nodes[0].map.get()).clone();
    for (id, n) in map1.nodes.iter_mut() {
        n.zone = if id.0 <= 2 { "a" } else { "b" }.to_string();
    }
    for n in &nodes {
        n.map.set(Arc::new(map1.clone()));
    }
    let before = VdiInfo {
        copies: 2,
        home_zone: Some("a".into()),
        home_copies: Some(2),
        ..vdi(ReplicationMode::Direct)
    };
    let publish_vdi = |v: &VdiInfo| {
        for n in &nodes {
            let mut c = catalog(&n.map.get(), &[]);
            Arc::make_mut(&mut c.vdis).insert(v.id, v.clone());
            n.local.catalog().publish(c);
        }
    };
    publish_vdi(&before);

    // The home moves to zone b at epoch 2 (the map's nodes unchanged, as a move is).
    let moved = VdiInfo {
        home_zone: Some("b".into()),
        nbd_clients: Vec::new(),
        past_homes: vec![PastHome {
            zone: Some("a".into()),
            until: Epoch(2),
        }],
        ..before.clone()
    };
    let map2 = ClusterMap {
        epoch: Epoch(2),
        ..map1
    };
    // An object none of whose new holders held it before.
    let oid = (0..16)
        .map(|i| ObjectId::new(before.id, i))
        .find(|&o| {
            let old = locate_before_move(&map2, &moved, o);
            locate_vdi(&map2, &moved, o)
                .iter()
                .all(|n| !old.contains(n))
        })
        .expect("an object that moves wholly");
    let data = pattern(9, 8192);
    nodes[3]
        .gateway
        .write(&before, oid, 4096, data.clone(), false, 1)
        .await
        .unwrap();
    nodes[3].gateway.flush(&before, &[oid]).await.unwrap();

    let new_holders = locate_vdi(&map2, &moved, oid);
    for n in &nodes {
        n.map.set(Arc::new(map2.clone()));
        let pending: HashSet<ObjectId> = if new_holders.contains(&n.id) {
            [oid].into()
        } else {
            HashSet::new()
        };
        n.local.catchup().install(Epoch(2), pending);
    }
    publish_vdi(&moved);

    // Through a node that holds no copy at all under either home, if there is one.
    let old_holders = locate_before_move(&map2, &moved, oid);
    let reader = nodes
        .iter()
        .find(|n| !new_holders.contains(&n.id) && !old_holders.contains(&n.id))
        .unwrap_or(&nodes[0]);
    let got = reader.gateway.read(&moved, oid, 4096, 8192).await.unwrap();
    assert_eq!(got, data, "the old copy's bytes");
    let text = reader.metrics.encode();
    assert_eq!(
        count(&text, "drove_gateway_reads_total{where=\"before-move\"}"),
        1,
        "{text}"
    );

    // Once a new holder is current (it recovered), reads go to it again.
    let h = nodes.iter().find(|n| n.id == new_holders[0]).unwrap();
    h.store.write(oid, 4096, &data).unwrap();
    h.local.catchup().mark_current(oid);
    let got = reader.gateway.read(&moved, oid, 4096, 8192).await.unwrap();
    assert_eq!(got, data);
    assert_eq!(
        count(
            &reader.metrics.encode(),
            "drove_gateway_reads_total{where=\"before-move\"}"
        ),
        1,
        "the second read came from the recovered holder"
    );
}
