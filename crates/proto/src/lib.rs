//! The peer protocol: what one drove node asks another on the data path
//! ([`PeerReq`]) and what it answers ([`PeerResp`]), the frame that carries them
//! ([`frame`], read by [`read`]), and the [`hello`] that opens every connection
//! and chooses its wire [`version`].
//! Written once for both sides: the gateway encodes requests and decodes responses,
//! the peer does the opposite, with the same functions.
#![deny(missing_docs)]

pub mod frame;
pub mod hello;
pub mod legacy;
mod msg;
pub mod read;
pub mod version;

pub use frame::{Encoded, Frame, FrameError, MAX_FRAME, WIRE_VERSION};
pub use hello::{Answer, Hello, HelloReply, Speaker, HELLO_MAX};
pub use msg::{ObjDigest, PeerReq, PeerResp, WireError, MAX_OIDS};
pub use read::{Budget, ReadLimits, Taken, PAYLOAD_ALIGN};
pub use version::{WireRange, HELLO_VERSION};
