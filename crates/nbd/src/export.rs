//! The contract between the NBD frontend and whatever stores the bytes: an [`Export`] is
//! one open disk (in drove, a VDI served by the volume layer) and [`Exports`] names and
//! opens them. Everything below the NBD session on the data path sits behind these traits.
use async_trait::async_trait;
use bytes::Bytes;
use drove_types::Result;
use std::sync::Arc;

/// The allocation status of one run of bytes, as `base:allocation` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length of the run in bytes.
    pub length: u64,
    /// The run is not allocated in the backend (`NBD_STATE_HOLE`).
    pub hole: bool,
    /// The run reads as zeroes (`NBD_STATE_ZERO`).
    pub zero: bool,
}

/// One open disk. Calls may run concurrently and may take milliseconds (they cross the
/// network to replicas); the session never holds a lock across them.
#[async_trait]
pub trait Export: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// True when several connections to this export see each other's writes after a
    /// FLUSH on any of them (advertise `NBD_FLAG_CAN_MULTI_CONN` only then).
    fn multi_conn(&self) -> bool;
    /// True for an export that must not be written (`NBD_FLAG_READ_ONLY`).
    fn read_only(&self) -> bool {
        false
    }
    /// Read `len` bytes at `offset`; the result must be exactly `len` bytes long.
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes>;
    /// Write `data` at `offset`; with `fua`, the data is durable when this returns.
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()>;
    /// Make `[offset, offset + len)` read as zeroes; durable on return with `fua`.
    async fn write_zeroes(&self, offset: u64, len: u32, fua: bool) -> Result<()>;
    /// Discard `[offset, offset + len)`; its contents are undefined afterwards.
    async fn trim(&self, offset: u64, len: u32) -> Result<()>;
    /// Make every write that completed before this call durable.
    async fn flush(&self) -> Result<()>;
    /// Allocation status of `[offset, offset + len)`: extents in order covering at least
    /// 1 byte (may be shorter than `len`).
    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>>;
}

/// What a client proved about itself when it connected: what an export's access
/// list is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// The unix socket: its file permissions and group decide who connects.
    Local,
    /// TCP without TLS, or TLS without a client certificate: nothing proved.
    Anonymous,
    /// TCP with TLS and a client certificate the listener's CA signed, by its
    /// common name (`None`: the certificate has none).
    Certificate(Option<String>),
}

/// A connected client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// How listings and logs name it: an address or a pid, with its certificate's
    /// name when it has one.
    pub label: String,
    /// What it proved.
    pub credential: Credential,
}

/// The catalogue of exports a server offers.
#[async_trait]
pub trait Exports: Send + Sync {
    /// The exports `client` may open, as `(name, description)`; the others are not
    /// named.
    async fn list(&self, client: &ClientInfo) -> Result<Vec<(String, String)>>;
    /// Open the export `name` for `client`. A `NotFound` error (also the answer for
    /// an export the client may not open, so that it learns nothing of it) becomes
    /// `NBD_REP_ERR_UNKNOWN`.
    async fn open(&self, name: &str, client: &ClientInfo) -> Result<Arc<dyn Export>>;
}
