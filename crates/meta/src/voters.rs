//! Which metadata members vote: a pure function of the members (voter or not, zone,
//! standing), the leader and the bounds, that returns the voters wanted and the one
//! membership change to make next. No I/O and no clock (how long a node has been
//! down is passed in): the leader's [`crate::vote_keeper`] reads the state, asks
//! [`plan`], and applies its step with openraft, one change at a time.
//!
//! # The rule
//! - **How many.** `n` = the largest odd number at most `max_voters` and at most the
//!   members that may sit (below), and at least 1. Never an even number once placed:
//!   2 voters fail when either fails, 1 only when that one does; 4 need 3, as 5 do.
//! - **Who may sit.** The leader always (a leader never demotes itself); a voter that
//!   is up, or down for less than `grace`; a member that is up and may vote (a data
//!   node with weight, or a witness). Last, a voter down for `grace` or more: it keeps
//!   its seat only when nobody up can take it. A draining node (`node leave`), a
//!   member the map does not have (a joiner not yet recorded, a node being removed)
//!   and a non-voter that is down never get a seat.
//! - **Where.** One seat per zone first, then a second per zone, and so on, zones in
//!   this order: the leader's, then those whose best member already votes, then the
//!   rest by name; inside a zone the leader, then voters up and witnesses up (a
//!   witness first: it is there to vote, so it takes its zone's seat from a data
//!   node, added before the data node is demoted), then voters down for less than
//!   `grace`, then the others, by id.
//!   Voters long down are placed only after every other member, one per zone first
//!   too. So zones joined one at a time end with a voter each (3 zones, 3 voters),
//!   two datacenters and a witness with 1 + 1 + 1 (or 2 + 2 + 1 with 5 voters), and
//!   the seats of a datacenter lost for longer than `grace` go to the others.
//! - **One step at a time**, never two changes at once: with more voters than `n`,
//!   demote one that is not wanted (down ones first); else promote a wanted member
//!   (the caller waits for it to catch up before it counts in the quorum); else
//!   demote one not wanted. A vote therefore moves by adding the new voter first and
//!   removing the old one after, so the voters up never fall below what they were.
//!   A demotion that would leave fewer voters up than a majority of the voters left
//!   is not made.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// One metadata member as the placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Its node id (the Raft id).
    pub id: u64,
    /// Whether it votes now.
    pub voter: bool,
    /// Its zone in the cluster map; `None` while the map does not have it.
    pub zone: Option<String>,
    /// Up, draining or down.
    pub standing: Standing,
    /// A witness (a voter only, no data): preferred as its zone's voter.
    pub witness: bool,
}

/// What the map says of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Up, and may vote (a data node with weight, or a witness).
    Up,
    /// Up but draining (`node leave` set its weight to 0): it is going away.
    Leaving,
    /// Marked down, for this long as far as the caller knows.
    Down(Duration),
}

/// One membership change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Make this learner a voter (once it has caught up).
    Promote(u64),
    /// Make this voter a learner (it stays a member).
    Demote(u64),
}

/// What [`plan`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The voters wanted.
    pub voters: BTreeSet<u64>,
    /// The next change towards them, if any.
    pub step: Option<Step>,
}

/// The tier of a voter down for `grace` or more: seated after everyone else.
const LONG_DOWN: u8 = 4;

/// How eager a member is to sit, lowest first (see the module doc): the leader, up
/// voters, voters down for less than `grace`, up members that may vote, voters
/// down longer; `None`: never.
fn tier(m: &Member, leader: u64, grace: Duration) -> Option<u8> {
    if m.id == leader {
        return Some(0);
    }
    m.zone.as_ref()?;
    match (m.voter, m.standing) {
        (true, Standing::Up) => Some(1),
        // A witness is there to vote: it sits as soon as an up voter would.
        (false, Standing::Up) if m.witness => Some(1),
        (true, Standing::Down(d)) if d < grace => Some(2),
        (false, Standing::Up) => Some(3),
        (true, Standing::Down(_)) => Some(LONG_DOWN),
        _ => None,
    }
}

/// The largest odd number at most `k` (at least 1).
fn odd_at_most(k: usize) -> usize {
    if k <= 1 {
        1
    } else if k.is_multiple_of(2) {
        k - 1
    } else {
        k
    }
}

/// The voters wanted and the next step towards them: `members` are every member of
/// the metadata (voters and learners), `leader` the node running this (the leader),
/// `max_voters` the bound, `grace` how long a voter may be down and keep its seat
/// while another member could take it.
pub(crate) fn plan(members: &[Member], leader: u64, max_voters: usize, grace: Duration) -> Plan {
    let seated: Vec<(u8, &Member)> = members
        .iter()
        .filter_map(|m| tier(m, leader, grace).map(|t| (t, m)))
        .collect();
    let n = odd_at_most(max_voters.min(seated.len()));
    let wanted = pick(&seated, leader, n);
    let voters: Vec<&Member> = members.iter().filter(|m| m.voter).collect();
    let chosen: BTreeSet<u64> = wanted.iter().copied().collect();
    let unwanted = || {
        let mut out: Vec<&Member> = voters
            .iter()
            .copied()
            .filter(|m| !chosen.contains(&m.id))
            .collect();
        // Down ones first (the longest down first), then draining, then unmapped,
        // then the highest id.
        out.sort_by_key(|m| {
            let rank = match m.standing {
                Standing::Down(d) => (0, u64::MAX - d.as_millis() as u64),
                Standing::Leaving => (1, 0),
                Standing::Up if m.zone.is_none() => (2, 0),
                Standing::Up => (3, 0),
            };
            (rank, u64::MAX - m.id)
        });
        out
    };
    let demote = || {
        unwanted()
            .into_iter()
            .find(|m| safe_to_demote(&voters, m.id))
            .map(|m| Step::Demote(m.id))
    };
    let step = if voters.len() > n {
        demote()
    } else if let Some(&p) = wanted
        .iter()
        .find(|id| !voters.iter().any(|v| v.id == **id))
    {
        Some(Step::Promote(p))
    } else {
        demote()
    };
    Plan {
        voters: chosen,
        step,
    }
}

/// Whether demoting voter `id` leaves a majority of the remaining voters up.
fn safe_to_demote(voters: &[&Member], id: u64) -> bool {
    let left: Vec<&&Member> = voters.iter().filter(|m| m.id != id).collect();
    let up = left
        .iter()
        .filter(|m| !matches!(m.standing, Standing::Down(_)))
        .count();
    !left.is_empty() && up > left.len() / 2
}

/// A zone (`None`: the leader's before the map has it) and its members' (tier, not
/// a witness, id): in order, the zone's first choice first.
type ZoneSeats<'a> = (Option<&'a str>, Vec<(u8, bool, u64)>);

/// `n` members of `seated` (with their tiers) in the order of the module doc.
fn pick(seated: &[(u8, &Member)], leader: u64, n: usize) -> Vec<u64> {
    let leader_zone = seated
        .iter()
        .find(|(_, m)| m.id == leader)
        .and_then(|(_, m)| m.zone.clone());
    let mut out = Vec::with_capacity(n);
    // First every member but the voters long down, then those.
    for last in [false, true] {
        let mut zones: BTreeMap<Option<&str>, Vec<(u8, bool, u64)>> = BTreeMap::new();
        for (t, m) in seated {
            if (*t == LONG_DOWN) == last && !out.contains(&m.id) {
                // The leader without a zone yet is a zone of its own.
                let zone = if m.id == leader && m.zone.is_none() {
                    None
                } else {
                    m.zone.as_deref()
                };
                zones.entry(zone).or_default().push((*t, !m.witness, m.id));
            }
        }
        let already = |z: Option<&str>| {
            seated
                .iter()
                .filter(|(_, m)| out.contains(&m.id) && m.zone.as_deref() == z)
                .count()
        };
        let mut order: Vec<ZoneSeats> = zones.into_iter().collect();
        for (_, ms) in &mut order {
            ms.sort_unstable();
        }
        order.sort_by_key(|(z, ms)| {
            let is_leaders = z.is_none() || z.map(str::to_string) == leader_zone;
            (!is_leaders, already(*z), ms.first().map(|m| m.0), *z)
        });
        let mut round = 0;
        while out.len() < n && order.iter().any(|(_, ms)| ms.len() > round) {
            for (_, ms) in &order {
                if out.len() == n {
                    break;
                }
                if let Some((_, _, id)) = ms.get(round) {
                    out.push(*id);
                }
            }
            round += 1;
        }
    }
    out
}

#[cfg(test)]
#[path = "voters_tests.rs"]
mod tests;
