//! Layer 2 of the data path: a VDI as a disk. A frontend asks for byte ranges; the
//! [`Volume`] cuts them into object extents ([`map`]) and sends each to the gateway.
//! Like a disk with a write cache, a write is volatile until a FLUSH (or FUA) makes
//! it durable; the volume remembers which objects were written since the last flush
//! so a FLUSH fsyncs exactly those, on every replica.
#![deny(missing_docs)]

mod cow;
pub mod lock;
pub mod map;
pub mod throttle;
mod torn;
mod volume;

pub use lock::{Lease, LockService};
pub use throttle::{Direction, Throttle};
pub use volume::{Allocation, Volume};
