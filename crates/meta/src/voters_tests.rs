//! Tests of the voter placement: clusters grown, shrunk and broken one event at a
//! time, every step applied as the leader would apply it, checking where the votes
//! end and what the voters were on the way.
use super::*;

const GRACE: Duration = Duration::from_secs(10);

fn up(id: u64, zone: &str) -> Member {
    Member {
        id,
        voter: false,
        zone: Some(zone.to_string()),
        standing: Standing::Up,
        witness: false,
    }
}

fn witness(id: u64, zone: &str) -> Member {
    Member {
        witness: true,
        ..up(id, zone)
    }
}

/// The members' voters, in id order.
fn voters(ms: &[Member]) -> Vec<u64> {
    ms.iter().filter(|m| m.voter).map(|m| m.id).collect()
}

/// The zones of the voters, sorted.
fn zones(ms: &[Member]) -> Vec<String> {
    let mut z: Vec<String> = ms
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.zone.clone().unwrap_or_default())
        .collect();
    z.sort();
    z
}

/// Apply steps until there is none; checks on the way that a step never leaves more
/// than the plan's voters plus one, and returns the steps.
fn settle(ms: &mut [Member], leader: u64, max: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for _ in 0..50 {
        let p = plan(ms, leader, max, GRACE);
        let Some(step) = p.step else {
            assert_eq!(voters(ms), p.voters.iter().copied().collect::<Vec<_>>());
            return steps;
        };
        match step {
            Step::Promote(id) => {
                let m = ms.iter_mut().find(|m| m.id == id).unwrap();
                assert!(!m.voter && m.standing == Standing::Up, "{m:?}");
                m.voter = true;
            }
            Step::Demote(id) => {
                assert_ne!(id, leader, "the leader demoted itself");
                let m = ms.iter_mut().find(|m| m.id == id).unwrap();
                assert!(m.voter, "{m:?}");
                m.voter = false;
            }
        }
        assert!(
            voters(ms).len() <= p.voters.len() + 1,
            "{:?} voters after {step:?}, {} wanted",
            voters(ms),
            p.voters.len()
        );
        steps.push(step);
    }
    panic!("no end to the steps: {steps:?}");
}

#[test]
fn test_zones_joined_one_at_a_time_end_with_one_voter_per_zone() {
    // Node 1 bootstraps as the only voter; the others join as learners one at a
    // time, zone after zone (the layout), the leader settling after each.
    let mut ms = vec![Member {
        voter: true,
        ..up(1, "z1")
    }];
    let mut seen = Vec::new();
    for (id, zone) in [(2, "z1"), (3, "z2"), (4, "z2"), (5, "z3"), (6, "z3")] {
        ms.push(up(id, zone));
        settle(&mut ms, 1, 3);
        seen.push(voters(&ms));
        assert_eq!(
            voters(&ms).len() % 2,
            1,
            "an even number of voters: {seen:?}"
        );
    }
    assert_eq!(
        seen,
        vec![
            vec![1],       // two nodes: one voter, not two
            vec![1, 2, 3], // z1 z1 z2: two zones cannot both be safe
            vec![1, 2, 3],
            vec![1, 3, 5], // z3 joined: z1's second vote moves there
            vec![1, 3, 5],
        ]
    );
    // 5 voters allowed: two per zone where they can be, one at most more than a zone.
    settle(&mut ms, 1, 5);
    assert_eq!(voters(&ms), vec![1, 2, 3, 4, 5]);
    assert_eq!(zones(&ms), ["z1", "z1", "z2", "z2", "z3"]);
}

#[test]
fn test_a_vote_moves_by_adding_the_new_voter_before_removing_the_old_one() {
    let mut ms = vec![
        Member {
            voter: true,
            ..up(1, "z1")
        },
        Member {
            voter: true,
            ..up(2, "z1")
        },
        Member {
            voter: true,
            ..up(3, "z2")
        },
        up(4, "z2"),
    ];
    ms.push(up(5, "z3"));
    let steps = settle(&mut ms, 1, 3);
    assert_eq!(steps, vec![Step::Promote(5), Step::Demote(2)]);
}

#[test]
fn test_two_datacenters_and_a_witness_vote_one_each_or_two_two_one() {
    let mut ms = vec![
        Member {
            voter: true,
            ..up(1, "z1")
        },
        up(2, "z1"),
        up(3, "z2"),
        up(4, "z2"),
        up(5, "witness"),
    ];
    settle(&mut ms, 1, 3);
    assert_eq!(zones(&ms), ["witness", "z1", "z2"]);
    settle(&mut ms, 1, 5);
    assert_eq!(zones(&ms), ["witness", "z1", "z1", "z2", "z2"]);
    // Back to 3: the witness keeps its vote, each datacenter one.
    settle(&mut ms, 1, 3);
    assert_eq!(zones(&ms), ["witness", "z1", "z2"]);
}

/// Three zones of two nodes, voters 1 (z1, leader), 3 (z2), 5 (z3).
fn three_by_two() -> Vec<Member> {
    let mut ms: Vec<Member> = [
        (1, "z1"),
        (2, "z1"),
        (3, "z2"),
        (4, "z2"),
        (5, "z3"),
        (6, "z3"),
    ]
    .iter()
    .map(|&(id, z)| up(id, z))
    .collect();
    for m in &mut ms {
        m.voter = [1, 3, 5].contains(&m.id);
    }
    ms
}

#[test]
fn test_a_zone_down_keeps_its_vote_for_the_grace_then_the_vote_moves_and_comes_back() {
    let mut ms = three_by_two();
    // z1 (with the old leader, node 1) lost; node 3 leads now.
    for m in ms.iter_mut().filter(|m| m.zone.as_deref() == Some("z1")) {
        m.standing = Standing::Down(Duration::from_secs(3));
    }
    assert_eq!(plan(&ms, 3, 3, GRACE).step, None, "within the grace");
    for m in ms.iter_mut().filter(|m| m.zone.as_deref() == Some("z1")) {
        m.standing = Standing::Down(GRACE);
    }
    let steps = settle(&mut ms, 3, 3);
    // Node 4 (z2, the leader's zone comes first) takes node 1's vote: added first.
    assert_eq!(steps, vec![Step::Promote(4), Step::Demote(1)]);
    assert_eq!(voters(&ms), vec![3, 4, 5]);
    // z1 is back: it gets a vote again and z2 gives up its second.
    for m in ms.iter_mut().filter(|m| m.zone.as_deref() == Some("z1")) {
        m.standing = Standing::Up;
    }
    let steps = settle(&mut ms, 3, 3);
    assert_eq!(steps, vec![Step::Promote(1), Step::Demote(4)]);
    assert_eq!(zones(&ms), ["z1", "z2", "z3"]);
}

#[test]
fn test_a_dead_voter_keeps_its_seat_when_nobody_up_can_take_it() {
    // Three nodes, node 3 dead for long: no one to give its vote to; the voters stay
    // three (two of them up), not one.
    let mut ms: Vec<Member> = [(1, "z1"), (2, "z2"), (3, "z3")]
        .iter()
        .map(|&(id, z)| Member {
            voter: true,
            ..up(id, z)
        })
        .collect();
    ms[2].standing = Standing::Down(Duration::from_secs(3600));
    assert_eq!(plan(&ms, 1, 3, GRACE).step, None);
    // A learner that is down is never promoted; two voters up do not shrink to one.
    ms.push(Member {
        standing: Standing::Down(Duration::from_secs(3600)),
        ..up(4, "z3")
    });
    assert_eq!(plan(&ms, 1, 3, GRACE).step, None);
}

#[test]
fn test_a_draining_or_removed_voter_gives_its_vote_to_an_up_member() {
    let mut ms = three_by_two();
    // Node 5 drains (`node leave`): node 6 of its zone takes the vote, added first.
    ms[4].standing = Standing::Leaving;
    let steps = settle(&mut ms, 1, 3);
    assert_eq!(steps, vec![Step::Promote(6), Step::Demote(5)]);
    // Node 3 left the map (being removed): node 4 takes its vote.
    ms[2].zone = None;
    let steps = settle(&mut ms, 1, 3);
    assert_eq!(steps, vec![Step::Promote(4), Step::Demote(3)]);
    assert_eq!(voters(&ms), vec![1, 4, 6]);
}

#[test]
fn test_the_leader_is_never_demoted_and_counts_before_it_is_in_the_map() {
    // Right after bootstrap node 1 votes and is not in the map yet.
    let ms = vec![Member {
        id: 1,
        voter: true,
        zone: None,
        standing: Standing::Up,
        witness: false,
    }];
    assert_eq!(plan(&ms, 1, 3, GRACE).step, None);
    // A draining leader keeps its vote (another leader moves it once elected).
    let mut ms = three_by_two();
    ms[0].standing = Standing::Leaving;
    let p = plan(&ms, 1, 3, GRACE);
    assert!(p.voters.contains(&1), "{p:?}");
    assert_eq!(p.step, None);
}

#[test]
fn test_up_voters_are_kept_before_voters_down_and_no_demotion_loses_the_majority() {
    // Five voters in five zones, two of them down a moment; the bound drops to 3.
    let mut ms: Vec<Member> = (1..=5)
        .map(|id| Member {
            voter: true,
            ..up(id, &format!("z{id}"))
        })
        .collect();
    ms[2].standing = Standing::Down(Duration::from_secs(1));
    ms[3].standing = Standing::Down(Duration::from_secs(2));
    let steps = settle(&mut ms, 1, 3);
    // The longest down goes first.
    assert_eq!(steps, vec![Step::Demote(4), Step::Demote(3)]);
    assert_eq!(voters(&ms), vec![1, 2, 5]);
    // Three voters, two down: demoting anyone would leave no majority up.
    let mut ms: Vec<Member> = (1..=3)
        .map(|id| Member {
            voter: true,
            ..up(id, "z1")
        })
        .collect();
    ms[1].standing = Standing::Down(Duration::from_secs(1));
    ms[2].standing = Standing::Down(Duration::from_secs(1));
    assert_eq!(plan(&ms, 1, 1, GRACE).step, None);
    assert!(!safe_to_demote(&ms.iter().collect::<Vec<_>>(), 3));
}

#[test]
fn test_more_zones_than_voters_keep_the_zones_that_vote() {
    // Four zones, three voters in z2, z3, z4 (the leader in z2): z1 joining later
    // takes nothing from them.
    let mut ms: Vec<Member> = [(2, "z2"), (3, "z3"), (4, "z4")]
        .iter()
        .map(|&(id, z)| Member {
            voter: true,
            ..up(id, z)
        })
        .collect();
    ms.push(up(1, "z1"));
    assert_eq!(plan(&ms, 2, 3, GRACE).step, None);
}

#[test]
fn test_a_witness_joining_two_datacenters_takes_the_second_vote_of_one() {
    // `drove up --nodes 4 --zones 2 --witness`: z1 z2 z1 z2 join round-robin, then
    // the witness in z3. Before it, two zones: 1 + 2 voters; it takes the vote of
    // the crowded zone, added before the data node is demoted.
    let mut ms = vec![Member {
        voter: true,
        ..up(1, "z1")
    }];
    for (id, zone) in [(2, "z2"), (3, "z1"), (4, "z2")] {
        ms.push(up(id, zone));
        settle(&mut ms, 1, 3);
    }
    assert_eq!(zones(&ms), ["z1", "z1", "z2"]);
    ms.push(witness(5, "z3"));
    let steps = settle(&mut ms, 1, 3);
    assert_eq!(steps, vec![Step::Promote(5), Step::Demote(3)]);
    assert_eq!(voters(&ms), vec![1, 2, 5]);
    // With the leader lost (z1 down past the grace) the witness and z2 keep the
    // majority; node 2 leads and z2's other node takes z1's seat.
    for m in ms.iter_mut().filter(|m| m.zone.as_deref() == Some("z1")) {
        m.standing = Standing::Down(GRACE);
    }
    let steps = settle(&mut ms, 2, 3);
    assert_eq!(steps, vec![Step::Promote(4), Step::Demote(1)]);
    assert_eq!(zones(&ms), ["z2", "z2", "z3"]);
}

#[test]
fn test_a_witness_is_preferred_to_a_data_node_as_the_voter_of_its_zone() {
    // One voter per zone, z3's a data node; a witness joins z3: it takes the seat.
    let mut ms = three_by_two();
    ms.push(witness(7, "z3"));
    let steps = settle(&mut ms, 1, 3);
    assert_eq!(steps, vec![Step::Promote(7), Step::Demote(5)]);
    assert_eq!(voters(&ms), vec![1, 3, 7]);
    // And keeps it: nothing more to do.
    assert_eq!(plan(&ms, 1, 3, GRACE).step, None);
    // A witness that is down is not promoted (a learner down never is).
    let mut ms = three_by_two();
    ms.push(Member {
        standing: Standing::Down(Duration::from_secs(1)),
        ..witness(7, "z3")
    });
    assert_eq!(plan(&ms, 1, 3, GRACE).step, None);
}
