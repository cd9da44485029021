//! Set-ups the simulator's tests share: a small one-zone cluster with one VDI, a
//! VM's volume attached through a node, and its first write.
use bytes::Bytes;
use drove_types::{NodeId, VdiInfo, WritePolicy};
use drove_volume::Volume;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::{Disks, SimCluster};
use crate::Model;

/// The object size of [`small`]'s VDI: 64 KiB.
pub const OBJECT: u32 = 64 << 10;

/// `nodes` nodes in one zone, 1 ms apart, on memory disks, and a sync VDI "v" of 16
/// objects of [`OBJECT`] bytes, published to every node.
pub async fn small(nodes: usize) -> (Arc<SimCluster>, VdiInfo) {
    let model = Model {
        zones: 1,
        nodes_per_zone: nodes,
        local_delay: Duration::from_millis(1),
        ..Model::default()
    };
    let c = SimCluster::new(model, OBJECT, Disks::Memory);
    let vdi = c
        .create_vdi("v", 16 * u64::from(OBJECT), None, WritePolicy::Sync)
        .await
        .expect("a VDI on a new cluster");
    c.publish();
    (c, vdi)
}

/// A volume of `vdi` through node `at`, one client attached (a VM's).
pub fn attached(c: &SimCluster, vdi: &VdiInfo, at: NodeId) -> Arc<Volume> {
    let node = c.node(at).expect("a node of the cluster");
    let v = Volume::new(
        vdi.clone(),
        Vec::new(),
        node.gateway.clone(),
        node.locks.clone(),
    );
    v.attach();
    v
}

/// A VM's first write through `v`, FUA. It takes the lock, which gives the VDI its
/// home zone: the volume writes once its record shows it (what the node's watch
/// does), so the write is tried again, a few times, with the record published.
pub async fn first_write(c: &SimCluster, v: &Arc<Volume>, offset: u64, data: Bytes) {
    let mut res = v.write(offset, data.clone(), true).await;
    for _ in 0..10 {
        if res.is_ok() {
            return;
        }
        c.publish();
        v.set_info(c.vdi(&v.info().name).expect("the VDI"), Vec::new());
        res = v.write(offset, data.clone(), true).await;
    }
    res.expect("the first write");
}
