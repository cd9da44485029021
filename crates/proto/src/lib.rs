//! The peer protocol: what one drove node asks another on the data path
//! ([`PeerReq`]) and what it answers ([`PeerResp`]), and the frame that carries them
//! ([`frame`]). Written once for both sides: the gateway encodes requests and decodes
//! responses, the peer does the opposite, with the same functions.
#![deny(missing_docs)]

pub mod frame;
mod msg;

pub use frame::{Encoded, Frame, FrameError, MAX_FRAME};
pub use msg::{ObjDigest, PeerReq, PeerResp, WireError, MAX_OIDS};
