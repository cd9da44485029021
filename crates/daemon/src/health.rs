//! `GET /api/health` (behind `drove cluster health`): one verdict, OK, WARN or ERR,
//! with its reasons, for an operator or a monitoring check.
//!
//! The answering node judges from its own copy of the metadata (quorum, nodes down)
//! and from what each up node says about itself (`GET /api/local/health`: recovery,
//! disk space, clock, zone-sync lag), all asked at once with a short timeout, so a
//! node that hangs costs [`ASK_TIMEOUT`] and is itself a finding. Down nodes are
//! asked too, only for a failed disk (a node whose disk failed keeps itself down
//! and says which disk, see disk.rs); their silence is no finding. The judging is
//! a pure function ([`judge`]) of those answers.
use axum::extract::State;
use axum::Json;
use drove_meta::{MetaState, QUORUM_FRESH};
use drove_types::clock::unix_ms;
use drove_types::{format_size, NodeId, NodeState, Result};
use futures::future::join_all;
use std::path::Path;
use std::time::Duration;

use crate::admin::{Admin, ApiResult};
use crate::api::{Health, HealthCheck, Level, LocalHealth};
use crate::clients::ask;

/// How long a node is given to describe itself.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Disk use (of what drove may use) from which a node's disk is near full.
const DISK_WARN: f64 = 0.85;
/// Disk use from which it is full for practical purposes.
const DISK_ERR: f64 = 0.95;
/// Clock difference (beyond what the round trip leaves uncertain) worth a warning.
const SKEW_WARN_MS: f64 = 500.0;
/// Share of a zone-sync lag bound from which the lag is a warning (at the bound,
/// writers are slowed).
const LAG_WARN: f64 = 0.5;
/// The most lag entries of one node that are looked at (an answer is not trusted to
/// be short).
const MAX_LAGS: usize = 10_000;

/// Size and free space (for an unprivileged writer) of the filesystem holding
/// `dir`, in bytes; `None` if it cannot be read.
pub(crate) fn disk_space(dir: &Path) -> Option<(u64, u64)> {
    drove_objstore::disk_space(dir).map(|d| (d.size, d.free))
}

/// This node's own answer.
fn local(a: &Admin) -> LocalHealth {
    let state = a.meta.state();
    let mut lags = Vec::new();
    for (id, lag) in a.exports.gateway().lags() {
        if let Some(info) = state.vdis.values().find(|v| v.id == id) {
            lags.push(crate::wan::report(info, Some(a.meta.node_id()), lag));
        }
    }
    let disk = disk_space(&a.store_dir);
    LocalHealth {
        node_id: a.meta.node_id(),
        unix_ms: unix_ms(),
        recovery: a.recoverer.progress(),
        disk_bytes: disk.map(|d| d.0),
        disk_free_bytes: disk.map(|d| d.1),
        disk_reserve_bytes: Some(a.reserve),
        data_dir: a.store_dir.parent().map(|d| d.display().to_string()),
        meta_stopped: a.meta.stopped(),
        disk_failed: crate::disk::failure(&a.disk),
        lags,
    }
}

/// `GET /api/local/health`.
pub(crate) async fn local_health(State(a): State<Admin>) -> ApiResult<LocalHealth> {
    Ok(Json(local(&a)))
}

/// What one up node answered (or why it did not), with this node's clock when the
/// question left and when the answer came back.
pub(crate) struct Answer {
    pub node: NodeId,
    pub reply: std::result::Result<LocalHealth, String>,
    pub asked_ms: u64,
    pub answered_ms: u64,
}

/// `GET /api/health`.
pub(crate) async fn health(State(a): State<Admin>) -> ApiResult<Health> {
    let me = a.meta.node_id();
    // Down nodes are asked too, for a failed disk only: one that keeps itself
    // down says which disk (and a dead one costs nothing but the wait).
    let mut others: Vec<(NodeId, String)> = a
        .meta
        .state()
        .map
        .nodes
        .values()
        .filter(|n| !n.witness || n.state == NodeState::Up)
        .map(|n| (n.id, n.admin_addr.clone()))
        .collect();
    others.retain(|(id, _)| *id != me);
    let a = &a;
    let http = &a.http;
    let asks = others.into_iter().map(|(node, addr)| async move {
        let url = a.url(&addr, "/api/local/health");
        let asked_ms = unix_ms();
        let res: Result<LocalHealth> = ask(http.get(&url).timeout(ASK_TIMEOUT), &url).await;
        Answer {
            node,
            reply: res.map_err(|e| e.to_string()),
            asked_ms,
            answered_ms: unix_ms(),
        }
    });
    let now = unix_ms();
    let mut answers = vec![Answer {
        node: me,
        reply: Ok(local(a)),
        asked_ms: now,
        answered_ms: now,
    }];
    answers.extend(join_all(asks).await);
    let state = a.meta.state();
    let voters = a.meta.status().voters;
    Ok(Json(judge(
        me,
        a.meta.quorum_age(),
        &state,
        &voters,
        &answers,
    )))
}

/// Share of a disk in use, 0 to 1 (1 for an empty size).
fn used_share(size: u64, free: u64) -> f64 {
    if size == 0 {
        1.0
    } else {
        1.0 - free as f64 / size as f64
    }
}

/// What node `n`'s disk (`size` bytes, `free` left) is worth saying, if anything:
/// ERR below the node's reserve (writes that need new space fail with ENOSPC) or
/// past [`DISK_ERR`], WARN past [`DISK_WARN`]. The message names the data
/// directory.
fn disk_check(n: NodeId, h: &LocalHealth, size: u64, free: u64) -> Option<HealthCheck> {
    let used = used_share(size, free);
    let reserve = h.disk_reserve_bytes.unwrap_or(0);
    let full = free < reserve;
    let level = if full || used >= DISK_ERR {
        Level::Err
    } else if used >= DISK_WARN {
        Level::Warn
    } else {
        return None;
    };
    let dir = h
        .data_dir
        .as_deref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    let what = if full {
        format!(
            "; below the {} it keeps for its metadata, writes that need new space there fail \
             with ENOSPC until space is freed (delete VDIs or snapshots, or add nodes)",
            format_size(reserve)
        )
    } else {
        String::new()
    };
    Some(check(
        level,
        "disk",
        format!(
            "node {n}'s disk{dir} is {:.0} % used: {} free of {}{what}",
            used * 100.0,
            format_size(free),
            format_size(size),
        ),
    ))
}

fn check(level: Level, check: &str, message: String) -> HealthCheck {
    HealthCheck {
        level,
        check: check.to_string(),
        message,
    }
}

/// The verdict of node `me`, from its metadata (`state`), how long ago it last knew
/// of a working metadata majority, the metadata's voters (none: not known, no voter
/// check) and the answers of the up nodes.
pub(crate) fn judge(
    me: NodeId,
    quorum_age: Option<Duration>,
    state: &MetaState,
    voters: &[NodeId],
    answers: &[Answer],
) -> Health {
    let mut checks = Vec::new();
    checks.push(quorum(me, quorum_age));
    checks.extend(nodes(state));
    checks.extend(crate::health_voters::voters(&state.map, voters));
    checks.extend(crate::upgrade::health_check(state));
    if state.settings.noout {
        checks.push(check(
            Level::Warn,
            "noout",
            "noout is set: down nodes are not re-replicated (`drove cluster set noout off` after the maintenance)"
                .to_string(),
        ));
    }
    let mut recovery = Vec::new();
    let mut disks = Vec::new();
    let mut clocks = Vec::new();
    let mut lags = Vec::new();
    let mut fullest: Option<(f64, NodeId)> = None;
    let mut widest_skew = 0.0f64;
    let mut zone_sync = (0usize, 0.0f64);
    for ans in answers {
        let down = state
            .map
            .node(ans.node)
            .is_some_and(|n| n.state != NodeState::Up);
        if down {
            // Down nodes are asked only for a failed disk they keep themselves
            // down for; silence from them is expected (the "nodes" check says so).
            if let Ok(h) = &ans.reply {
                disks.extend(failed_disk(ans.node, h));
            }
            continue;
        }
        let h = match &ans.reply {
            Ok(h) if h.node_id == ans.node => h,
            Ok(h) => {
                checks.push(check(
                    Level::Warn,
                    "reach",
                    format!(
                        "the address of node {} answered as node {}: its map entry is out of date",
                        ans.node, h.node_id
                    ),
                ));
                continue;
            }
            Err(e) => {
                checks.push(check(
                    Level::Warn,
                    "reach",
                    format!(
                        "node {} is up in the map but did not describe itself within {} s: {e}",
                        ans.node,
                        ASK_TIMEOUT.as_secs()
                    ),
                ));
                continue;
            }
        };
        let n = ans.node;
        disks.extend(failed_disk(n, h));
        recovery.extend(recovering(n, h, state.map.epoch.0));
        if let Some(why) = &h.meta_stopped {
            checks.push(check(
                Level::Err,
                "meta",
                format!(
                    "node {n}'s metadata service stopped: {}; the node exits so that its \
                     service manager starts it again",
                    why
                ),
            ));
        }
        if let (Some(size), Some(free)) = (h.disk_bytes, h.disk_free_bytes) {
            if let Some(c) = disk_check(n, h, size, free) {
                disks.push(c);
            }
            let used = used_share(size, free);
            if fullest.is_none_or(|(u, _)| used > u) {
                fullest = Some((used, n));
            }
        }
        // The clock difference, give or take half the round trip.
        let mid = (ans.asked_ms as f64 + ans.answered_ms as f64) / 2.0;
        let skew = h.unix_ms as f64 - mid;
        let slack = ans.answered_ms.saturating_sub(ans.asked_ms) as f64 / 2.0;
        widest_skew = widest_skew.max(skew.abs());
        if skew.abs() - slack > SKEW_WARN_MS {
            clocks.push(check(
                Level::Warn,
                "clock",
                format!(
                    "node {n}'s clock is {:.1} s {} node {me}'s (± {:.0} ms)",
                    skew.abs() / 1000.0,
                    if skew > 0.0 { "ahead of" } else { "behind" },
                    slack
                ),
            ));
        }
        for l in h.lags.iter().take(MAX_LAGS) {
            zone_sync.0 += 1;
            let share = (l.seconds * 1000.0 / l.max_lag_ms.max(1) as f64)
                .max(l.bytes as f64 / l.max_lag_bytes.max(1) as f64);
            zone_sync.1 = zone_sync.1.max(l.seconds);
            if share >= LAG_WARN {
                lags.push(check(
                    Level::Warn,
                    "lag",
                    format!(
                        "VDI '{}' (written through node {n}) is {:.1} s / {} behind in the other zones, {:.0} % of its bound ({:.1} s / {}){}",
                        l.vdi,
                        l.seconds,
                        format_size(l.bytes),
                        share * 100.0,
                        l.max_lag_ms as f64 / 1000.0,
                        format_size(l.max_lag_bytes),
                        if share >= 1.0 { "; its writers are being slowed" } else { "" }
                    ),
                ));
            }
        }
    }
    let answered = answers
        .iter()
        .filter(|a| {
            a.reply.is_ok()
                && state
                    .map
                    .node(a.node)
                    .is_none_or(|n| n.state == NodeState::Up)
        })
        .count();
    push_or_ok(&mut checks, recovery, "recovery", || {
        format!(
            "{answered} node(s) answering are current at epoch {}",
            state.map.epoch.0
        )
    });
    push_or_ok(&mut checks, disks, "disk", || match fullest {
        Some((used, n)) => format!("fullest disk: node {n}, {:.0} % used", used * 100.0),
        None => "no node reported its disk".to_string(),
    });
    push_or_ok(&mut checks, clocks, "clock", || {
        format!("clocks agree with node {me}'s within {widest_skew:.0} ms")
    });
    push_or_ok(&mut checks, lags, "lag", || match zone_sync {
        (0, _) => "no VDI is being written with zone-sync".to_string(),
        (n, s) => format!("{n} zone-sync VDI(s) written; the largest lag is {s:.1} s"),
    });
    // Worst first; the order of the checks within a level is kept.
    checks.sort_by_key(|c| std::cmp::Reverse(c.level));
    Health {
        status: checks.iter().map(|c| c.level).max().unwrap_or(Level::Ok),
        node_id: me,
        quorum_age_ms: quorum_age.map(|a| a.as_millis() as u64),
        checks,
    }
}

/// `found`, or one `ok` finding for `name` when there is none.
fn push_or_ok(
    checks: &mut Vec<HealthCheck>,
    found: Vec<HealthCheck>,
    name: &str,
    ok: impl FnOnce() -> String,
) {
    if found.is_empty() {
        checks.push(check(Level::Ok, name, ok()));
    } else {
        checks.extend(found);
    }
}

fn quorum(me: NodeId, age: Option<Duration>) -> HealthCheck {
    const STALE: &str = "metadata changes (create, attach for writing, failover) cannot \
                         commit, and what this node shows is its last view";
    match age {
        Some(a) if a < QUORUM_FRESH => check(
            Level::Ok,
            "quorum",
            format!(
                "node {me} knows a working metadata majority (confirmed {:.1} s ago)",
                a.as_secs_f64()
            ),
        ),
        Some(a) => check(
            Level::Err,
            "quorum",
            format!(
                "node {me} last knew of a working metadata majority {:.1} s ago: {STALE}",
                a.as_secs_f64()
            ),
        ),
        None => check(
            Level::Err,
            "quorum",
            format!(
                "node {me} has not known a working metadata majority since it started: {STALE}"
            ),
        ),
    }
}

/// Nodes down: a warning, or an error once as many are down as the fewest copies
/// of any VDI (some object may then have no reachable copy).
fn nodes(state: &MetaState) -> Vec<HealthCheck> {
    let all = state.map.nodes.len();
    let down: Vec<String> = state
        .map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Down)
        .map(|n| format!("{} (zone {})", n.id, n.zone))
        .collect();
    let leaving = state
        .map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Up && n.weight == 0 && !n.witness)
        .count();
    let leaving = if leaving > 0 {
        format!(", {leaving} of them draining")
    } else {
        String::new()
    };
    if down.is_empty() {
        return vec![check(
            Level::Ok,
            "nodes",
            format!("{all} of {all} nodes up{leaving}"),
        )];
    }
    let fewest = state
        .vdis
        .values()
        .map(|v| v.copies)
        .min()
        .unwrap_or(state.settings.default_copies);
    // A witness holds no copy: its loss takes none away.
    let down_data = state
        .map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Down && !n.witness)
        .count();
    let (level, more) = if down_data >= usize::from(fewest) {
        (
            Level::Err,
            format!(
                "; {down_data} down is as many as the fewest copies of a VDI ({fewest}): some objects may have no reachable copy"
            ),
        )
    } else if down_data == 0 {
        (
            Level::Warn,
            "; witnesses hold no data: only the metadata voters are fewer".to_string(),
        )
    } else {
        (
            Level::Warn,
            "; objects with a copy there are below their copies until recovery has copied them elsewhere"
                .to_string(),
        )
    };
    vec![check(
        level,
        "nodes",
        format!(
            "node(s) {} down: {} of {all} nodes up{leaving}{more}",
            down.join(", "),
            all - down.len()
        ),
    )]
}

/// An error when node `n` says its disk failed (what it answers every request
/// with, naming the disk and the first failure). Only the node itself is believed:
/// its answer is checked to come from it before this is called.
fn failed_disk(n: NodeId, h: &LocalHealth) -> Option<HealthCheck> {
    if h.node_id != n {
        return None;
    }
    let why: String = h.disk_failed.as_deref()?.chars().take(1024).collect();
    Some(check(
        Level::Err,
        "disk",
        format!(
            "node {n}: {why}; it keeps itself down and its objects are re-replicated \
             elsewhere: replace the disk and restart the node (docs/self-healing.md)"
        ),
    ))
}

/// A warning when node `n` is not yet current at the map's epoch.
fn recovering(n: NodeId, h: &LocalHealth, epoch: u64) -> Option<HealthCheck> {
    let p = &h.recovery;
    if p.clean && p.epoch >= epoch {
        return None;
    }
    if p.clean {
        return Some(check(
            Level::Warn,
            "recovery",
            format!(
                "node {n} is current at epoch {} and has not yet begun recovering to epoch {epoch}",
                p.epoch
            ),
        ));
    }
    let eta = match p.eta_s {
        Some(s) => format!(", about {s:.0} s left"),
        None => String::new(),
    };
    let mut failed = if p.failed > 0 {
        format!(" ({} failed, retried)", p.failed)
    } else {
        String::new()
    };
    if p.waiting_noout > 0 {
        failed.push_str(&format!(" ({} held back by noout)", p.waiting_noout));
    }
    if p.waiting_full > 0 {
        failed.push_str(&format!(
            " ({} held back: its disk is {:.0}% full, at or past the cluster's backfill-full; free space or raise it with `drove cluster config --backfill-full`)",
            p.waiting_full,
            p.disk_used_pct.unwrap_or(0.0)
        ));
    }
    Some(check(
        Level::Warn,
        "recovery",
        format!(
            "node {n} is recovering to epoch {}: {} of {} objects done{failed}, {}/s{eta}; until it is done they are below their copies",
            p.epoch,
            p.done,
            p.total,
            format_size(p.rate_bytes_s as u64)
        ),
    ))
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
