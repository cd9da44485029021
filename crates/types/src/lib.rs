//! Words shared by every layer of drove: identifiers ([`NodeId`], [`VdiId`],
//! [`ObjectId`], [`Epoch`]), the cluster map ([`ClusterMap`], [`NodeInfo`]), the VDI
//! record ([`VdiInfo`]), size parsing, and the one error type ([`Error`]) whose
//! [`ErrorKind`] each frontend maps to its own error codes.
#![deny(missing_docs)]

pub mod clock;
mod error;
mod features;
mod ids;
pub mod local_cluster;
mod log_target;
mod map;
pub mod private_fs;
pub mod qos;
pub mod random;
mod shown;
mod size;
mod utc;
mod vdi;
mod voters;

pub use error::{Error, ErrorKind, Result};
pub use features::{
    feature_name, level_for_node, BASE_FEATURE_LEVEL, FEATURE_LEVEL, TEST_LEVEL_ENV,
};
pub use ids::{ClusterId, Epoch, NodeId, ObjVersion, ObjectId, VdiId};
pub use log_target::CONNECTION_LOG;
pub use map::{ClusterMap, NodeInfo, NodeState};
pub use qos::Qos;
pub use shown::{shown, Shown, SHOWN_CHARS};
pub use size::{format_size, parse_size};
pub use utc::Utc;
pub use vdi::{
    is_kept, kept_name, kept_original, validate_client_names, validate_max_lag, validate_name,
    PastHome, ReplicationMode, VdiInfo, WritePolicy, DEFAULT_MAX_LAG_BYTES, DEFAULT_MAX_LAG_MS,
    DEFAULT_OBJECT_SIZE, KEPT_PREFIX, MAX_CLIENT_NAME, MAX_COPIES, MAX_NBD_CLIENTS, MAX_PAST_HOMES,
};
pub use voters::{VoterZones, UNKNOWN_ZONE};

/// Size of a checksummed block inside an object, in bytes.
pub const BLOCK_SIZE: u64 = 4096;
