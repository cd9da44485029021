//! The gateway's way to mark failed replicas down: a command through the metadata,
//! committed before a write is acknowledged without them.
use drove_meta::{Command, MetaApi};
use drove_types::Result;
use std::sync::Arc;

/// The gateway's [`drove_replica::Membership`]: failed replicas are marked down
/// through the metadata before a write is acknowledged without them.
pub struct MetaMembership(pub Arc<dyn MetaApi>);

impl drove_replica::Membership for MetaMembership {
    fn mark_down(
        &self,
        nodes: Vec<drove_types::NodeId>,
        why: String,
        silent: bool,
        seen: drove_types::Epoch,
    ) -> futures::future::BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let hold_ms = if silent {
                self.0.state().settings.hold_down_ms
            } else {
                0
            };
            // The reason goes into the epoch history, bounded.
            let reason: String = why.chars().take(512).collect();
            let judged = Some(drove_meta::Judged {
                by: self.0.node_id(),
                seen,
            });
            // Nodes of other zones first: a verdict on one of them is refused
            // once a node of this node's zone was marked down since `seen`
            // (feature level 4), and this batch's own must not count. A refusal
            // stops the batch before its verdicts on this zone: the request is
            // judged again on the new map.
            let mut nodes = nodes;
            {
                let state = self.0.state();
                let zone = |id| state.map.nodes.get(&id).map(|n| n.zone.clone());
                let mine = zone(self.0.node_id());
                nodes.sort_by_key(|id| zone(*id) == mine);
            }
            for id in nodes {
                tracing::warn!(node = %id, hold_ms, "marking node down {why}");
                self.0
                    .execute(Command::SetNodeState {
                        id,
                        state: drove_types::NodeState::Down,
                        reason: reason.clone(),
                        hold_ms,
                        judged,
                    })
                    .await?;
            }
            Ok(())
        })
    }
}
