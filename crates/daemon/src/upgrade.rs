//! `drove cluster upgrade`: the cluster's feature level, what each node's build
//! knows, and `finish`, which raises the level to this build's once every node runs
//! a build that knows it (see `drove_types::FEATURE_LEVEL`). Until then the commands
//! of the new level are refused, so that nodes of the older build never meet a log
//! entry they cannot read.
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use drove_meta::{Command, MetaState};
use drove_types::{NodeId, NodeInfo, FEATURE_LEVEL};

use crate::admin::{Admin, ApiErr};
use crate::api;

type ApiResult<T> = std::result::Result<Json<T>, ApiErr>;

/// The upgrade routes.
pub fn router() -> Router<Admin> {
    Router::new()
        .route("/api/cluster/upgrade", get(status))
        .route("/api/cluster/upgrade/finish", post(finish))
}

/// The levels as `state` has them, and this build's.
fn upgrade_of(state: &MetaState) -> api::Upgrade {
    api::Upgrade {
        feature_level: state.settings.feature_level,
        this_build: FEATURE_LEVEL,
        was: None,
        nodes: state
            .map
            .nodes
            .values()
            .map(|n| api::NodeLevel {
                id: n.id,
                zone: n.zone.clone(),
                features: n.feature_level(),
                version: n.version.clone(),
            })
            .collect(),
    }
}

async fn status(State(a): State<Admin>) -> ApiResult<api::Upgrade> {
    Ok(Json(upgrade_of(&a.meta.state())))
}

/// Raise the level to this build's; already there (or above): nothing to do.
async fn finish(State(a): State<Admin>) -> ApiResult<api::Upgrade> {
    let was = a.meta.state().settings.feature_level;
    if was < FEATURE_LEVEL {
        a.meta
            .execute(Command::FinishUpgrade {
                level: FEATURE_LEVEL,
            })
            .await?;
        tracing::warn!(
            was,
            level = FEATURE_LEVEL,
            "cluster feature level raised by an operator: nodes of older builds can no longer join"
        );
    }
    let mut u = upgrade_of(&a.meta.state());
    u.was = Some(was);
    Ok(Json(u))
}

/// `cluster health`'s `upgrade` check: WARN while the nodes run builds of different
/// feature levels or versions (an upgrade half done), or when every node knows a
/// level the cluster has not been raised to (`drove cluster upgrade finish` left).
pub(crate) fn health_check(state: &MetaState) -> Option<api::HealthCheck> {
    let nodes: Vec<_> = state.map.nodes.values().collect();
    let first = nodes.first()?;
    let mixed = nodes
        .iter()
        .any(|n| n.feature_level() != first.feature_level() || n.version != first.version);
    let level = state.settings.feature_level;
    let message = if mixed {
        // Group the nodes by build: "nodes 1, 2 run drove 0.2.0 (level 2); node 3 ...".
        let mut builds: std::collections::BTreeMap<(u32, &str), Vec<String>> = Default::default();
        for n in &nodes {
            builds
                .entry((n.feature_level(), n.version.as_str()))
                .or_default()
                .push(n.id.to_string());
        }
        let said: Vec<String> = builds
            .iter()
            .map(|((lvl, version), ids)| {
                let who = match ids.len() {
                    1 => format!("node {} runs", ids[0]),
                    _ => format!("nodes {} run", ids.join(", ")),
                };
                let version = match *version {
                    "" => "a build from before feature levels".to_string(),
                    v => format!("drove {v}"),
                };
                format!("{who} {version} (feature level {lvl})")
            })
            .collect();
        format!(
            "the nodes run different builds: {}; the cluster is at feature level {level} \
             (upgrade the rest, then `drove cluster upgrade finish`)",
            said.join("; ")
        )
    } else if first.feature_level() > level {
        format!(
            "every node knows feature level {}, the cluster is at level {level}: run `drove \
             cluster upgrade finish` to use {}",
            first.feature_level(),
            drove_types::feature_name(first.feature_level())
        )
    } else {
        return None;
    };
    Some(api::HealthCheck {
        level: api::Level::Warn,
        check: "upgrade".to_string(),
        message,
    })
}

/// What each node's record in the map says of its build: (features, version).
type Builds = std::collections::BTreeMap<NodeId, (u32, String)>;

fn builds(state: &MetaState) -> Builds {
    state
        .map
        .nodes
        .values()
        .map(|n| (n.id, (n.features, n.version.clone())))
        .collect()
}

/// The record node `me` should write again, if any: its own as the map has it,
/// with this build's `features` and `version`.
///
/// A node records its build at start. But a member of an older build applies that
/// record without the fields it does not know, and keeps the loss in its state
/// (and in the snapshots it sends) even after it is upgraded in turn; a rolling
/// upgrade left nodes 2 and 3 at level 1 in the last node's state this way, and
/// `finish` was refused. So a node records its build again when its record in its
/// own map says otherwise, and whenever another node's build changes (that node
/// restarted with a new build, and may have lost what the others recorded while
/// it ran an older one). The rest of the record is the map's, unchanged: a
/// drained node's weight stays 0.
/// `now` is `builds(state)`, which the caller keeps as what it has seen.
fn record_again(
    seen: &Builds,
    now: &Builds,
    state: &MetaState,
    me: NodeId,
    features: u32,
    version: &str,
) -> Option<NodeInfo> {
    let mine = state.map.nodes.get(&me)?;
    let others_changed = now
        .iter()
        .any(|(id, b)| *id != me && seen.get(id).is_some_and(|was| was != b));
    if !others_changed && mine.features == features && mine.version == version {
        return None;
    }
    let mut n = mine.clone();
    n.features = features;
    n.version = version.to_string();
    Some(n)
}

/// Keep node `me`'s record of its build (`features`, `version`) in the map: see
/// [`record_again`]. Runs once the node has recorded itself at start.
pub async fn keep_build_recorded(
    meta: std::sync::Arc<drove_meta::Meta>,
    me: NodeId,
    features: u32,
    version: String,
) {
    let mut seen = builds(&meta.state());
    let mut tick = tokio::time::interval(RECORD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let state = meta.state();
        let now = builds(&state);
        let Some(n) = record_again(&seen, &now, &state, me, features, &version) else {
            seen = now;
            continue;
        };
        match meta.execute(Command::UpsertNode(n)).await {
            Ok(_) => {
                tracing::info!(node = %me, "recorded this node's build again ({version}, feature level {features})");
                seen = now;
            }
            // Tried again at the next tick (`seen` is kept).
            Err(e) => tracing::warn!(node = %me, "could not record this node's build: {e}"),
        }
    }
}

/// How often a node looks at the map's record of its build.
const RECORD_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    fn state(nodes: &[(u64, u32, &str)], level: u32) -> MetaState {
        let mut s = MetaState::default();
        for &(id, features, version) in nodes {
            s.map.nodes.insert(
                NodeId(id),
                NodeInfo {
                    features,
                    version: version.to_string(),
                    ..NodeInfo::new(NodeId(id), "z")
                },
            );
        }
        s.settings.feature_level = level;
        s
    }

    #[test]
    fn test_health_warns_while_builds_are_mixed_and_until_the_level_is_raised() {
        let all_new = state(&[(1, 2, "0.2.0"), (2, 2, "0.2.0")], 2);
        assert_eq!(health_check(&all_new), None);
        let all_old = state(&[(1, 0, ""), (2, 0, "")], 1);
        assert_eq!(health_check(&all_old), None);
        let mixed = state(&[(1, 2, "0.2.0"), (2, 0, ""), (3, 2, "0.2.0")], 1);
        let c = health_check(&mixed).unwrap();
        assert_eq!(c.level, api::Level::Warn);
        assert_eq!(
            c.message,
            "the nodes run different builds: node 2 runs a build from before feature levels \
             (feature level 1); nodes 1, 3 run drove 0.2.0 (feature level 2); the cluster is \
             at feature level 1 (upgrade the rest, then `drove cluster upgrade finish`)"
        );
        // Same level, another version (a patch release): still said.
        let patch = state(&[(1, 2, "0.2.0"), (2, 2, "0.2.1")], 2);
        assert!(health_check(&patch).is_some());
        let behind = state(&[(1, 2, "0.2.0"), (2, 2, "0.2.0")], 1);
        assert!(health_check(&behind)
            .unwrap()
            .message
            .starts_with("every node knows feature level 2, the cluster is at level 1"));
    }

    #[test]
    fn test_a_node_records_its_build_again_when_its_record_or_another_nodes_build_changes() {
        let me = NodeId(2);
        // Its record is right and nothing changed: nothing to write.
        let st = state(&[(1, 2, "0.2.0"), (2, 2, "0.2.0")], 1);
        assert_eq!(
            record_again(&builds(&st), &builds(&st), &st, me, 2, "0.2.0"),
            None
        );
        // Its record lost the fields (applied by a member of an older build).
        let lost = state(&[(1, 2, "0.2.0"), (2, 0, "")], 1);
        let mut drained = lost.clone();
        drained.map.nodes.get_mut(&me).unwrap().weight = 0;
        let n = record_again(
            &builds(&drained),
            &builds(&drained),
            &drained,
            me,
            2,
            "0.2.0",
        )
        .unwrap();
        assert_eq!((n.id, n.features, n.version.as_str()), (me, 2, "0.2.0"));
        assert_eq!(n.weight, 0, "the rest of the record is the map's");
        // Another node came back with a new build: its state may lack this
        // node's record, so it is written again although it looks right here.
        let before = state(&[(1, 0, ""), (2, 2, "0.2.0")], 1);
        let after = state(&[(1, 2, "0.2.0"), (2, 2, "0.2.0")], 1);
        assert!(record_again(&builds(&before), &builds(&after), &after, me, 2, "0.2.0").is_some());
        // A node not in the map yet (or removed) writes nothing.
        assert_eq!(
            record_again(&Builds::new(), &builds(&st), &st, NodeId(9), 2, "0.2.0"),
            None
        );
    }
}
