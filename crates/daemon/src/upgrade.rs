//! `drove cluster upgrade`: the cluster's feature level, what each node's build
//! knows, and `finish`, which raises the level to this build's once every node runs
//! a build that knows it (see `drove_types::FEATURE_LEVEL`). Until then the commands
//! of the new level are refused, so that nodes of the older build never meet a log
//! entry they cannot read.
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use drove_meta::{Command, MetaState};
use drove_types::FEATURE_LEVEL;

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

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::{NodeId, NodeInfo};

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
}
