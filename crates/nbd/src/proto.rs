//! NBD wire constants, copied by name and value from the protocol document
//! (NetworkBlockDevice/nbd `doc/proto.md`). Everything on the NBD side of the data path
//! (handshake, requests, replies) refers to these; no other file spells a magic number.

/// `NBDMAGIC`: first 8 bytes the server sends (also called `INIT_PASSWD`).
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second server magic of newstyle negotiation, and the magic of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of every option reply in fixed newstyle negotiation.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

/// Handshake flag: the server speaks fixed newstyle.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;

/// Client flag: the client speaks fixed newstyle.
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: do not send the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is supported.
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: the export behaves like a rotational medium.
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
/// Transmission flag: `NBD_CMD_TRIM` is supported.
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` (and `NBD_CMD_FLAG_NO_HOLE`) is supported.
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: `NBD_CMD_FLAG_DF` is supported on reads (structured replies only).
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: several connections share one cache; FLUSH/FUA are visible on all.
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: `NBD_CMD_CACHE` is understood.
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag: `NBD_CMD_FLAG_FAST_ZERO` is supported.
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option: choose an export and enter transmission (no error possible).
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
/// Option: abort negotiation.
pub const NBD_OPT_ABORT: u32 = 2;
/// Option: list exports.
pub const NBD_OPT_LIST: u32 = 3;
/// Option: upgrade to TLS (offered on TCP when the node has certificates).
pub const NBD_OPT_STARTTLS: u32 = 5;
/// Option: describe an export without entering transmission.
pub const NBD_OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const NBD_OPT_GO: u32 = 7;
/// Option: use structured replies in transmission.
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list metadata contexts.
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select metadata contexts.
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply: success / end of a list.
pub const NBD_REP_ACK: u32 = 1;
/// Option reply: one export of `NBD_OPT_LIST`.
pub const NBD_REP_SERVER: u32 = 2;
/// Option reply: one `NBD_INFO_*` item.
pub const NBD_REP_INFO: u32 = 3;
/// Option reply: one metadata context.
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks error replies.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
/// Option reply error: unknown option.
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR + 1;
/// Option reply error: forbidden by policy.
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR + 2;
/// Option reply error: syntactically or semantically invalid option.
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR + 3;
/// Option reply error: not supported on this platform.
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR + 4;
/// Option reply error: TLS required.
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR + 5;
/// Option reply error: the export does not exist.
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR + 6;
/// Option reply error: the server is shutting down.
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR + 7;
/// Option reply error: block size information must be requested.
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR + 8;
/// Option reply error: request or reply too large.
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR + 9;

/// Info item: size and transmission flags.
pub const NBD_INFO_EXPORT: u16 = 0;
/// Info item: canonical export name.
pub const NBD_INFO_NAME: u16 = 1;
/// Info item: export description.
pub const NBD_INFO_DESCRIPTION: u16 = 2;
/// Info item: minimum, preferred and maximum block sizes.
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

/// Request magic.
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// Simple reply magic.
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Structured reply chunk magic.
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Command flag: force unit access (persist before replying).
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag: WRITE_ZEROES must not punch a hole.
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag: READ must be answered with at most one content chunk.
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag: BLOCK_STATUS wants exactly one extent.
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag: WRITE_ZEROES must fail fast with ENOTSUP unless it is fast.
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: last chunk of this reply.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;

/// Structured chunk: nothing (final chunk only).
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
/// Structured chunk: data at an offset.
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured chunk: a run of zeroes at an offset.
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Structured chunk: block status descriptors for one metadata context.
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Structured chunk: an error.
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
/// Structured chunk: an error at an offset.
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

/// Command: read.
pub const NBD_CMD_READ: u16 = 0;
/// Command: write (payload follows the header).
pub const NBD_CMD_WRITE: u16 = 1;
/// Command: disconnect (no reply).
pub const NBD_CMD_DISC: u16 = 2;
/// Command: flush.
pub const NBD_CMD_FLUSH: u16 = 3;
/// Command: trim (discard).
pub const NBD_CMD_TRIM: u16 = 4;
/// Command: cache (prefetch hint).
pub const NBD_CMD_CACHE: u16 = 5;
/// Command: write zeroes.
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
/// Command: block status.
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

/// `base:allocation` state bit: the extent is a hole.
pub const NBD_STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` state bit: the extent reads as zeroes.
pub const NBD_STATE_ZERO: u32 = 1 << 1;

/// Error: operation not permitted.
pub const NBD_EPERM: u32 = 1;
/// Error: input/output error.
pub const NBD_EIO: u32 = 5;
/// Error: cannot allocate memory.
pub const NBD_ENOMEM: u32 = 12;
/// Error: invalid argument.
pub const NBD_EINVAL: u32 = 22;
/// Error: no space left on device.
pub const NBD_ENOSPC: u32 = 28;
/// Error: value too large.
pub const NBD_EOVERFLOW: u32 = 75;
/// Error: operation not supported.
pub const NBD_ENOTSUP: u32 = 95;
/// Error: server shutting down.
pub const NBD_ESHUTDOWN: u32 = 108;

/// The only metadata context we serve.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The context id we hand out for `base:allocation` on `NBD_OPT_SET_META_CONTEXT`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Request header length on the wire.
pub const REQUEST_LEN: usize = 28;
/// Simple reply header length on the wire.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Structured reply chunk header length on the wire.
pub const STRUCTURED_HEADER_LEN: usize = 20;

/// Advertised minimum block size: any byte is addressable.
pub const MIN_BLOCK_SIZE: u32 = 1;
/// Advertised preferred block size.
pub const PREFERRED_BLOCK_SIZE: u32 = 4096;
/// Advertised maximum payload of READ and WRITE (the protocol's default, 32 MiB).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Longest string (export name, query, message) the protocol allows.
pub const MAX_STRING: usize = 4096;
/// Longest option payload we accept; a longer one is a broken or hostile client.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Most block status descriptors in one chunk (the protocol's recommended cap).
pub const MAX_EXTENTS: usize = 1 << 20;
