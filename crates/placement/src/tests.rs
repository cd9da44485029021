//! Tests of [`crate::locate`]: the rules (length, distinctness, zones, down nodes),
//! balance over 10,000 objects, and how little data moves when a node joins or leaves.
use crate::{is_holder, locate, locate_home, Home};
use drove_types::{ClusterMap, Epoch, NodeId, NodeInfo, NodeState, ObjectId, VdiId};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const OBJECTS: u32 = 10_000;

fn node(id: u64, zone: &str, weight: u32) -> NodeInfo {
    NodeInfo {
        id: NodeId(id),
        zone: zone.to_string(),
        weight,
        admin_addr: format!("10.0.0.{id}:7000"),
        peer_addr: format!("10.0.0.{id}:7001"),
        nbd_addr: format!("10.0.0.{id}:10809"),
        nbd_socket: format!("/run/drove/{id}.sock"),
        state: NodeState::Up,
        witness: false,
        ..NodeInfo::new(NodeId(id), zone)
    }
}

fn map_of(nodes: impl IntoIterator<Item = NodeInfo>) -> ClusterMap {
    ClusterMap {
        epoch: Epoch(1),
        nodes: nodes.into_iter().map(|n| (n.id, n)).collect(),
    }
}

/// Nodes 1..=n, each in its own zone, weight 1.
fn own_zones(n: u64) -> ClusterMap {
    map_of((1..=n).map(|i| node(i, &format!("z{i}"), 1)))
}

/// 10,000 objects spread over four VDIs, as a volume layer would name them.
fn objects() -> impl Iterator<Item = ObjectId> {
    (0..OBJECTS).map(|i| ObjectId::new(VdiId(1 + i % 4), i / 4))
}

/// How many replicas each node holds over [`objects`].
fn load(map: &ClusterMap, copies: usize) -> BTreeMap<NodeId, u32> {
    let mut counts: BTreeMap<NodeId, u32> = map.nodes.keys().map(|&id| (id, 0)).collect();
    for oid in objects() {
        for id in locate(map, oid, copies) {
            *counts.entry(id).or_default() += 1;
        }
    }
    counts
}

/// Fraction of replica slots whose node changed from `old` to `new`: for each object
/// the replicas in the new set that were not in the old one (the copies recovery has
/// to make), over all slots. With copies = 1 this is the fraction of objects moved.
fn moved_fraction(old: &ClusterMap, new: &ClusterMap, copies: usize) -> f64 {
    let (mut moved, mut slots) = (0usize, 0usize);
    for oid in objects() {
        let before: BTreeSet<NodeId> = locate(old, oid, copies).into_iter().collect();
        let after: BTreeSet<NodeId> = locate(new, oid, copies).into_iter().collect();
        moved += after.difference(&before).count();
        slots += after.len();
    }
    moved as f64 / slots as f64
}

fn zones_of(map: &ClusterMap, ids: &[NodeId]) -> BTreeSet<String> {
    ids.iter()
        .filter_map(|id| map.node(*id))
        .map(|n| n.zone.clone())
        .collect()
}

#[test]
fn test_locate_is_deterministic() {
    let map = own_zones(5);
    // Same map built in the opposite order: the BTreeMap makes order irrelevant, and
    // the result must not depend on anything but the contents.
    let reversed = map_of((1..=5).rev().map(|i| node(i, &format!("z{i}"), 1)));
    for oid in objects().take(1000) {
        let first = locate(&map, oid, 3);
        assert_eq!(first, locate(&map, oid, 3));
        assert_eq!(first, locate(&reversed, oid, 3));
    }
}

#[test]
fn test_placement_is_pinned_across_builds() {
    // Placement must be the same on every node, platform and release; a change to the
    // hash would silently move every object. These values were computed once (and agree with an
    // independent Python model).
    let map = own_zones(5);
    let got: Vec<Vec<u64>> = (0..4)
        .map(|i| locate(&map, ObjectId::new(VdiId(1), i), 3))
        .map(|ids| ids.into_iter().map(|id| id.0).collect())
        .collect();
    assert_eq!(got, PINNED);
}

const PINNED: [[u64; 3]; 4] = [[4, 2, 3], [2, 4, 3], [1, 2, 5], [3, 5, 1]];

#[test]
fn test_empty_map_or_zero_copies_gives_nothing() {
    let oid = ObjectId::new(VdiId(1), 0);
    assert!(locate(&ClusterMap::default(), oid, 3).is_empty());
    assert!(locate(&own_zones(4), oid, 0).is_empty());
    assert!(!is_holder(&own_zones(4), oid, 0, NodeId(1)));
}

#[test]
fn test_length_is_min_of_copies_and_up_nodes() {
    for n in 1..=6u64 {
        let map = own_zones(n);
        for copies in 0..=7usize {
            for oid in objects().take(50) {
                let got = locate(&map, oid, copies);
                assert_eq!(got.len(), copies.min(n as usize), "n={n} copies={copies}");
                let distinct: BTreeSet<_> = got.iter().collect();
                assert_eq!(distinct.len(), got.len());
            }
        }
    }
}

#[test]
fn test_zero_weight_and_down_nodes_hold_nothing() {
    let mut map = own_zones(5);
    if let Some(n) = map.nodes.get_mut(&NodeId(2)) {
        n.weight = 0;
    }
    if let Some(n) = map.nodes.get_mut(&NodeId(4)) {
        n.state = NodeState::Down;
    }
    for oid in objects().take(2000) {
        let got = locate(&map, oid, 5);
        assert_eq!(got.len(), 3, "only nodes 1, 3, 5 count");
        assert!(!got.contains(&NodeId(2)) && !got.contains(&NodeId(4)));
        assert!(!is_holder(&map, oid, 5, NodeId(4)));
        assert!(is_holder(&map, oid, 5, NodeId(1)));
    }
}

#[test]
fn test_a_witness_holds_nothing_even_with_a_weight_or_a_home_in_its_zone() {
    // Two datacenters of two nodes and a witness in z3. The map never carries a
    // witness with weight (the metadata refuses it); placement skips it anyway.
    let mut map = map_of([
        node(1, "z1", 1),
        node(2, "z1", 1),
        node(3, "z2", 1),
        node(4, "z2", 1),
        NodeInfo {
            witness: true,
            ..node(5, "z3", 1)
        },
    ]);
    for weight in [0, 1] {
        map.nodes.get_mut(&NodeId(5)).unwrap().weight = weight;
        for oid in objects().take(2000) {
            let got = locate(&map, oid, 3);
            assert_eq!(got.len(), 3, "{oid}: {got:?}");
            assert!(!got.contains(&NodeId(5)), "{oid} on the witness: {got:?}");
            let home = Home {
                zone: "z3",
                copies: 1,
            };
            let got = locate_home(&map, oid, 3, Some(home));
            assert!(!got.contains(&NodeId(5)), "{oid} on the witness: {got:?}");
        }
    }
}

#[test]
fn test_replicas_use_distinct_zones_when_there_are_enough() {
    // 6 nodes in 3 zones, two per zone.
    let map = map_of((1..=6).map(|i| node(i, &format!("z{}", i % 3), 1)));
    for oid in objects() {
        for copies in 1..=3 {
            let got = locate(&map, oid, copies);
            assert_eq!(zones_of(&map, &got).len(), copies, "{oid}: {got:?}");
        }
    }
}

#[test]
fn test_fewer_zones_than_copies_uses_every_zone_then_fills() {
    // Zone "a" has three nodes, zone "b" one: copies 3 must include node 4 every time.
    let map = map_of([
        node(1, "a", 1),
        node(2, "a", 1),
        node(3, "a", 1),
        node(4, "b", 1),
    ]);
    for oid in objects() {
        let got = locate(&map, oid, 3);
        assert_eq!(got.len(), 3);
        assert!(got.contains(&NodeId(4)), "{oid}: {got:?}");
        assert_eq!(zones_of(&map, &got).len(), 2);
        let distinct: BTreeSet<_> = got.iter().collect();
        assert_eq!(distinct.len(), 3);
    }
}

#[test]
fn test_equal_weights_share_within_ten_percent() {
    for n in [3u64, 4, 5, 8] {
        let map = own_zones(n);
        for copies in [1usize, 3] {
            let expected = f64::from(OBJECTS) * copies as f64 / n as f64;
            for (id, count) in load(&map, copies) {
                let dev = (f64::from(count) - expected).abs() / expected;
                assert!(
                    dev <= 0.10,
                    "n={n} copies={copies} node {id}: {count} vs {expected}"
                );
            }
        }
    }
}

#[test]
fn test_double_weight_gets_double_share() {
    // One zone so that zones do not constrain; copies 1. Expected: 2/5 and 1/5 each.
    let map = map_of([
        node(1, "a", 2),
        node(2, "a", 1),
        node(3, "a", 1),
        node(4, "a", 1),
    ]);
    let counts = load(&map, 1);
    let heavy = f64::from(counts[&NodeId(1)]);
    for id in 2..=4 {
        let ratio = heavy / f64::from(counts[&NodeId(id)]);
        assert!(
            (1.7..=2.3).contains(&ratio),
            "node 1 vs {id}: ratio {ratio}"
        );
    }
    let expected_heavy = f64::from(OBJECTS) * 2.0 / 5.0;
    assert!((heavy - expected_heavy).abs() / expected_heavy <= 0.15);
}

#[test]
fn test_adding_a_node_moves_at_most_its_share() {
    for n in 3..=8u64 {
        let old = own_zones(n);
        let new = own_zones(n + 1);
        let bound = 1.2 / (n + 1) as f64;
        for copies in [1usize, 3] {
            let moved = moved_fraction(&old, &new, copies);
            assert!(
                moved <= bound,
                "n={n} copies={copies}: moved {moved:.4} > {bound:.4}"
            );
        }
    }
}

/// `n` nodes spread round-robin over `zones` zones, weight 1, plus the map with node
/// `n + 1` joined: in the next zone of the round-robin (`shared`), or alone in a new one.
fn zoned_join(zones: u64, n: u64, shared: bool) -> (ClusterMap, ClusterMap) {
    let old = map_of((1..=n).map(|i| node(i, &format!("z{}", i % zones), 1)));
    let mut new = old.clone();
    let zone = if shared {
        format!("z{}", (n + 1) % zones)
    } else {
        "znew".to_string()
    };
    let joined = node(n + 1, &zone, 1);
    new.nodes.insert(joined.id, joined);
    (old, new)
}

#[test]
fn test_adding_a_node_to_an_existing_zone_moves_at_most_its_share() {
    // Zones constrain here: 2 zones (< copies 3) and 3 zones (= copies 3).
    for zones in [2u64, 3] {
        for n in 3..=8u64 {
            let (old, new) = zoned_join(zones, n, true);
            let bound = 1.2 / (n + 1) as f64;
            for copies in [1usize, 3] {
                let moved = moved_fraction(&old, &new, copies);
                assert!(
                    moved <= bound,
                    "zones={zones} n={n} copies={copies}: {moved:.4}"
                );
            }
        }
    }
}

#[test]
fn test_adding_a_node_in_a_new_zone_moves_data_only_onto_it() {
    // Copies 1 ignores zones, so the 1.2/(N+1) bound holds. With copies 3 the zone
    // rule hands the lone new zone more than its weight's share (see the ignored test
    // below); what still holds is that nothing moves except onto the new node.
    for zones in [2u64, 3] {
        for n in 3..=8u64 {
            let (old, new) = zoned_join(zones, n, false);
            let bound = 1.2 / (n + 1) as f64;
            let moved = moved_fraction(&old, &new, 1);
            assert!(moved <= bound, "zones={zones} n={n} copies=1: {moved:.4}");
            let on_new = f64::from(load(&new, 3)[&NodeId(n + 1)]) / f64::from(3 * OBJECTS);
            assert_eq!(moved_fraction(&old, &new, 3), on_new, "zones={zones} n={n}");
        }
    }
}

/// Known to fail: with copies 3, a node joining alone in a new zone next to 2 or 3
/// zones of equal nodes takes more than 1.2/(N+1) of the slots. Measured moved
/// fractions (bound in brackets), 3 zones: n=5 0.2116 (0.2000), n=6 0.1783 (0.1714),
/// n=7 0.1693 (0.1500), n=8 0.1552 (0.1333); 2 zones: 0.3333 for every n, because
/// the third zone must then hold one replica of every object. Greedy zone-by-zone
/// picking makes a zone compete with the summed weight of its nodes, and choosing 3
/// of 4 zones without replacement favours the light zone. Kept strict, not loosened.
#[test]
#[ignore = "known to fail: the zone rule overloads a lone new zone with copies 3"]
fn test_adding_a_node_in_a_new_zone_moves_at_most_its_share_with_three_copies() {
    for zones in [2u64, 3] {
        for n in 3..=8u64 {
            let (old, new) = zoned_join(zones, n, false);
            let bound = 1.2 / (n + 1) as f64;
            let moved = moved_fraction(&old, &new, 3);
            assert!(
                moved <= bound,
                "zones={zones} n={n}: moved {moved:.4} > {bound:.4}"
            );
        }
    }
}

#[test]
fn test_down_node_is_skipped_and_only_its_objects_move() {
    let map = own_zones(5);
    let mut down = map.clone();
    if let Some(n) = down.nodes.get_mut(&NodeId(3)) {
        n.state = NodeState::Down;
    }
    let mut removed = map.clone();
    removed.nodes.remove(&NodeId(3));
    let mut moved = 0;
    for oid in objects() {
        let before = locate(&map, oid, 1);
        let after = locate(&down, oid, 1);
        assert_eq!(after, locate(&removed, oid, 1), "down and removed agree");
        assert!(!after.contains(&NodeId(3)));
        if before != after {
            assert_eq!(before, vec![NodeId(3)], "{oid} moved but was not on node 3");
            moved += 1;
        }
    }
    assert!(moved > 0, "node 3 held something");
}

/// Maps of up to 8 nodes with ids 1..=8, 0..=3 zones' worth of labels, weights 0..=3
/// and random states.
fn arb_map() -> impl Strategy<Value = ClusterMap> {
    prop::collection::btree_map(1u64..=8, (0u8..3, 0u32..4, any::<bool>()), 0..=8).prop_map(
        |nodes| {
            map_of(nodes.into_iter().map(|(id, (zone, weight, up))| {
                let mut n = node(id, &format!("z{zone}"), weight);
                n.state = if up { NodeState::Up } else { NodeState::Down };
                n
            }))
        },
    )
}

fn arb_oid() -> impl Strategy<Value = ObjectId> {
    (any::<u32>(), any::<u32>()).prop_map(|(v, i)| ObjectId::new(VdiId(v), i))
}

fn eligible(map: &ClusterMap) -> Vec<&NodeInfo> {
    map.up_nodes().filter(|n| n.weight > 0).collect()
}

proptest! {
    #[test]
    fn test_locate_follows_the_rules(map in arb_map(), oid in arb_oid(), copies in 0usize..7) {
        let got = locate(&map, oid, copies);
        prop_assert_eq!(&got, &locate(&map, oid, copies));
        let ok = eligible(&map);
        prop_assert_eq!(got.len(), copies.min(ok.len()));
        let distinct: BTreeSet<_> = got.iter().collect();
        prop_assert_eq!(distinct.len(), got.len());
        for id in &got {
            prop_assert!(ok.iter().any(|n| n.id == *id), "{} is not eligible", id);
        }
        // As many zones as possible: min(copies, zones among eligible nodes).
        let zones: BTreeSet<&str> = ok.iter().map(|n| n.zone.as_str()).collect();
        prop_assert_eq!(zones_of(&map, &got).len(), copies.min(zones.len()));
    }

    #[test]
    fn test_more_copies_extend_the_list(map in arb_map(), oid in arb_oid(), copies in 0usize..6) {
        // Raising a VDI's copies only adds replicas; it never reshuffles existing ones.
        let short = locate(&map, oid, copies);
        let long = locate(&map, oid, copies + 1);
        prop_assert_eq!(&long[..short.len()], &short[..]);
    }

    #[test]
    fn test_adding_a_node_only_moves_replicas_onto_it(
        map in arb_map(), oid in arb_oid(), copies in 1usize..5, zone in 0u8..4, weight in 1u32..4,
    ) {
        // Node 9 joins (zone 3 is a new zone). An object whose list does not contain it
        // keeps the exact same list; one that does gains it in place of at most one node.
        // Read backwards this is also the removal property.
        join_moves_at_most_one(&map, oid, copies, zone, weight, None)?;
    }
}

/// A home zone among the labels [`arb_map`] uses (z3 is a zone no node has).
fn arb_home() -> impl Strategy<Value = (String, usize)> {
    (0u8..4, 0usize..4).prop_map(|(z, c)| (format!("z{z}"), c))
}

proptest! {
    #[test]
    fn test_no_home_places_as_before(map in arb_map(), oid in arb_oid(), copies in 0usize..7) {
        prop_assert_eq!(locate_home(&map, oid, copies, None), locate(&map, oid, copies));
    }

    #[test]
    fn test_home_copies_come_first_on_distinct_home_nodes(
        map in arb_map(), oid in arb_oid(), copies in 0usize..7, (zone, want) in arb_home(),
    ) {
        let home = Home { zone: &zone, copies: want };
        let got = locate_home(&map, oid, copies, Some(home));
        prop_assert_eq!(&got, &locate_home(&map, oid, copies, Some(home)));
        let ok = eligible(&map);
        prop_assert_eq!(got.len(), copies.min(ok.len()));
        let distinct: BTreeSet<_> = got.iter().collect();
        prop_assert_eq!(distinct.len(), got.len());
        let zone_of = |id: &NodeId| map.node(*id).map(|n| n.zone.clone()).unwrap_or_default();
        // The home share: min(wanted, copies, eligible home nodes), first in the list.
        let home_nodes = ok.iter().filter(|n| n.zone == zone).count();
        let share = want.min(copies).min(home_nodes);
        for id in &got[..share] {
            prop_assert_eq!(zone_of(id), zone.clone());
        }
        // The rest: as many distinct other zones as there are, before any repeats; the
        // home zone again only when nothing else is left.
        let rest = &got[share..];
        let others: BTreeSet<String> =
            ok.iter().filter(|n| n.zone != zone).map(|n| n.zone.clone()).collect();
        let rest_zones: BTreeSet<String> =
            rest.iter().map(zone_of).filter(|z| *z != zone).collect();
        prop_assert_eq!(rest_zones.len(), rest.len().min(others.len()));
        let outside = ok.iter().filter(|n| n.zone != zone).count();
        let home_in_rest = rest.iter().filter(|id| zone_of(id) == zone).count();
        prop_assert_eq!(home_in_rest, rest.len().saturating_sub(outside));
    }

    #[test]
    fn test_with_a_home_adding_a_node_only_moves_replicas_onto_it(
        map in arb_map(), oid in arb_oid(), copies in 1usize..5, zone in 0u8..4,
        weight in 1u32..4, (home, want) in arb_home(),
    ) {
        let h = Some(Home { zone: &home, copies: want });
        join_moves_at_most_one(&map, oid, copies, zone, weight, h)?;
    }
}

/// The paper's set-up, 4 zones of 2 nodes, copies 3, home zone z0: every object has
/// both z0 nodes and one node of another zone, the other zones sharing that copy
/// evenly; without a home, z0 holds a copy of only about 3/4 of the objects.
#[test]
fn test_home_zone_on_four_zones_of_two() {
    let map = map_of((1..=8).map(|i| node(i, &format!("z{}", (i - 1) / 2), 1)));
    let home = Some(Home {
        zone: "z0",
        copies: 2,
    });
    let mut remote = BTreeMap::<String, u32>::new();
    let mut without = 0;
    for oid in objects() {
        let got = locate_home(&map, oid, 3, home);
        let zones: Vec<String> = got
            .iter()
            .map(|id| map.node(*id).unwrap().zone.clone())
            .collect();
        assert_eq!(&zones[..2], ["z0", "z0"], "{oid}: {got:?}");
        assert_ne!(zones[2], "z0");
        *remote.entry(zones[2].clone()).or_default() += 1;
        if !locate(&map, oid, 3)
            .iter()
            .any(|id| map.node(*id).unwrap().zone == "z0")
        {
            without += 1;
        }
    }
    for (z, n) in &remote {
        let share = f64::from(*n) / f64::from(OBJECTS);
        assert!((share - 1.0 / 3.0).abs() < 0.03, "{z}: {share}");
    }
    let share = f64::from(without) / f64::from(OBJECTS);
    assert!(
        (share - 0.25).abs() < 0.03,
        "objects with no copy in z0: {share}"
    );
}

/// Node 9 joins `map` in zone `zone`: an object whose list does not contain it keeps
/// the exact same list; one that does gains it in place of at most one node.
fn join_moves_at_most_one(
    map: &ClusterMap,
    oid: ObjectId,
    copies: usize,
    zone: u8,
    weight: u32,
    home: Option<Home<'_>>,
) -> Result<(), TestCaseError> {
    let mut grown = map.clone();
    let joined = node(9, &format!("z{zone}"), weight);
    grown.nodes.insert(joined.id, joined);
    let before = locate_home(map, oid, copies, home);
    let after = locate_home(&grown, oid, copies, home);
    if after.contains(&NodeId(9)) {
        let old: BTreeSet<_> = before.iter().collect();
        let new: BTreeSet<_> = after.iter().collect();
        prop_assert_eq!(new.difference(&old).count(), 1);
        prop_assert!(old.difference(&new).count() <= 1);
    } else {
        prop_assert_eq!(before, after);
    }
    Ok(())
}

/// A VDI (copies 3) whose home moved from z1 to z2 at epoch 5.
fn moved_vdi() -> drove_types::VdiInfo {
    drove_types::VdiInfo {
        id: VdiId(7),
        name: "moved".into(),
        size: 1 << 30,
        object_size: 4 << 20,
        copies: 3,
        mode: drove_types::ReplicationMode::Direct,
        created: 0,
        min_copies: None,
        parent: None,
        snapshot: false,
        ephemeral: false,
        home_zone: Some("z2".into()),
        home_copies: None,
        policy: drove_types::WritePolicy::Sync,
        max_lag_ms: None,
        max_lag_bytes: None,
        nbd_clients: Vec::new(),
        qos: Default::default(),
        past_homes: vec![drove_types::PastHome {
            zone: Some("z1".into()),
            until: Epoch(5),
        }],
    }
}

#[test]
fn test_a_moved_vdi_is_placed_by_the_home_of_each_maps_epoch() {
    let two_each = |epoch| ClusterMap {
        epoch: Epoch(epoch),
        ..map_of((1..=6).map(|i| node(i, &format!("z{}", i.div_ceil(2)), 1)))
    };
    let v = moved_vdi();
    let home = |zone| Some(Home { zone, copies: 2 });
    for oid in objects().take(500) {
        let (before, after) = (two_each(4), two_each(5));
        assert_eq!(
            crate::locate_vdi(&before, &v, oid),
            locate_home(&before, oid, 3, home("z1"))
        );
        let now = crate::locate_vdi(&after, &v, oid);
        assert_eq!(now, locate_home(&after, oid, 3, home("z2")));
        assert_eq!(
            crate::locate_before_move(&after, &v, oid),
            locate_home(&after, oid, 3, home("z1")),
            "the copies a move copies from"
        );
        let in_z2 = now.iter().filter(|n| [3, 4].contains(&n.0)).count();
        assert_eq!(in_z2, 2, "two copies in the new home");
    }
    let mut never = v.clone();
    never.past_homes.clear();
    let oid = objects().next().unwrap();
    assert!(crate::locate_before_move(&two_each(5), &never, oid).is_empty());
}

/// The ranking of every eligible node, whole, then the passes: what `locate_home` did
/// before it ordered only the top of the ranking.
fn locate_by_whole_ranking(
    map: &ClusterMap,
    oid: ObjectId,
    copies: usize,
    home: Option<Home<'_>>,
) -> Vec<NodeId> {
    let mut ranked = crate::scored(map, oid);
    ranked.sort_by(crate::by_rank);
    crate::pick(&ranked, copies.min(ranked.len()), home, false).unwrap()
}

/// Maps of 20 to 120 nodes in up to 6 zones (most up, weights 0..=3): larger than
/// the ranked prefix `locate_home` orders first.
fn arb_big_map() -> impl Strategy<Value = ClusterMap> {
    prop::collection::vec((0u8..6, 0u32..4, 0u8..10), 20..=120).prop_map(|nodes| {
        map_of(nodes.into_iter().enumerate().map(|(i, (zone, weight, s))| {
            let mut n = node(i as u64 + 1, &format!("z{zone}"), weight);
            n.state = if s == 0 {
                NodeState::Down
            } else {
                NodeState::Up
            };
            n
        }))
    })
}

proptest! {
    #[test]
    fn test_ordering_only_the_top_of_the_ranking_places_as_the_whole_ranking(
        map in arb_big_map(), oid in arb_oid(), copies in 0usize..8,
        zone in 0u8..7, home_copies in 0usize..5, zoned in any::<bool>(),
    ) {
        let zone = format!("z{zone}");
        let home = zoned.then_some(Home { zone: &zone, copies: home_copies });
        prop_assert_eq!(
            locate_home(&map, oid, copies, home),
            locate_by_whole_ranking(&map, oid, copies, home)
        );
    }
}

#[test]
fn test_the_paper_scale_map_places_as_the_whole_ranking() {
    // 4 zones of 22 nodes, homes in each zone with 2 copies there: the simulator's
    // paper set-up, over many objects (the prefix is walked past now and then).
    let map = map_of((1..=88u64).map(|i| node(i, &format!("z{}", (i - 1) / 22), 1)));
    for z in 0..4 {
        let zone = format!("z{z}");
        for oid in objects() {
            let home = Some(Home {
                zone: &zone,
                copies: 2,
            });
            assert_eq!(
                locate_home(&map, oid, 3, home),
                locate_by_whole_ranking(&map, oid, 3, home)
            );
        }
    }
}
