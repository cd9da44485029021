//! Transmission-phase requests: the 28-byte header, the command it names, and the
//! checks a request must pass before it reaches the export (bounds, payload limit,
//! command flags). Pure functions; `session.rs` reads the bytes and `exec.rs` runs the
//! checked request against the export.
use crate::handshake::Negotiated;
use crate::proto::*;
use crate::wire::Reader;

/// A transmission command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE`; `length` bytes of payload follow the header.
    Write,
    /// `NBD_CMD_DISC`.
    Disc,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
    /// `NBD_CMD_CACHE`.
    Cache,
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS`.
    BlockStatus,
    /// Anything else.
    Unknown(u16),
}

impl Command {
    /// The command for a wire type.
    pub fn from_wire(t: u16) -> Command {
        match t {
            NBD_CMD_READ => Command::Read,
            NBD_CMD_WRITE => Command::Write,
            NBD_CMD_DISC => Command::Disc,
            NBD_CMD_FLUSH => Command::Flush,
            NBD_CMD_TRIM => Command::Trim,
            NBD_CMD_CACHE => Command::Cache,
            NBD_CMD_WRITE_ZEROES => Command::WriteZeroes,
            NBD_CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    /// The wire type of this command.
    pub fn to_wire(self) -> u16 {
        match self {
            Command::Read => NBD_CMD_READ,
            Command::Write => NBD_CMD_WRITE,
            Command::Disc => NBD_CMD_DISC,
            Command::Flush => NBD_CMD_FLUSH,
            Command::Trim => NBD_CMD_TRIM,
            Command::Cache => NBD_CMD_CACHE,
            Command::WriteZeroes => NBD_CMD_WRITE_ZEROES,
            Command::BlockStatus => NBD_CMD_BLOCK_STATUS,
            Command::Unknown(t) => t,
        }
    }

    /// The name used in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Command::Read => "read",
            Command::Write => "write",
            Command::Disc => "disc",
            Command::Flush => "flush",
            Command::Trim => "trim",
            Command::Cache => "cache",
            Command::WriteZeroes => "write_zeroes",
            Command::BlockStatus => "block_status",
            Command::Unknown(_) => "unknown",
        }
    }

    /// Commands that change the export's contents: a FLUSH must wait for these.
    pub fn is_write(self) -> bool {
        matches!(self, Command::Write | Command::WriteZeroes | Command::Trim)
    }

    /// Command flags this command accepts. FUA is accepted on every command because
    /// the protocol requires it once `SEND_FUA` is advertised (clients set it freely).
    fn allowed_flags(self, structured: bool) -> u16 {
        NBD_CMD_FLAG_FUA
            | match self {
                Command::Read if structured => NBD_CMD_FLAG_DF,
                Command::WriteZeroes => NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
                Command::BlockStatus => NBD_CMD_FLAG_REQ_ONE,
                _ => 0,
            }
    }
}

/// One request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`NBD_CMD_FLAG_*`).
    pub flags: u16,
    /// The command.
    pub command: Command,
    /// The client's opaque cookie (handle), echoed in the reply.
    pub cookie: u64,
    /// Byte offset in the export.
    pub offset: u64,
    /// Byte length (of the payload, for WRITE).
    pub length: u32,
}

/// The header did not start with `NBD_REQUEST_MAGIC`: the stream is not NBD (or lost
/// sync), so the session closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadRequestMagic(pub u32);

impl Request {
    /// Parse a header.
    pub fn decode(buf: &[u8; REQUEST_LEN]) -> Result<Request, BadRequestMagic> {
        let mut r = Reader::new(buf);
        // A 28-byte array always holds every field; the defaults are unreachable.
        let magic = r.u32().unwrap_or_default();
        if magic != NBD_REQUEST_MAGIC {
            return Err(BadRequestMagic(magic));
        }
        Ok(Request {
            flags: r.u16().unwrap_or_default(),
            command: Command::from_wire(r.u16().unwrap_or_default()),
            cookie: r.u64().unwrap_or_default(),
            offset: r.u64().unwrap_or_default(),
            length: r.u32().unwrap_or_default(),
        })
    }

    /// Encode a header (client side; used by tests and tools).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_wire().to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Whether FUA is set.
    pub fn fua(&self) -> bool {
        self.flags & NBD_CMD_FLAG_FUA != 0
    }

    /// Payload bytes that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }

    /// Check the request against the negotiated export; `Err` carries the NBD errno to
    /// reply with. A failed WRITE's payload must still be consumed by the caller.
    pub fn check(&self, n: &Negotiated) -> Result<(), u32> {
        let cmd = self.command;
        if let Command::Unknown(_) = cmd {
            return Err(NBD_EINVAL);
        }
        if self.flags & !cmd.allowed_flags(n.structured) != 0 {
            return Err(NBD_EINVAL);
        }
        match cmd {
            // Offset and length are reserved for these; lenient about nonzero values.
            Command::Disc | Command::Flush => return Ok(()),
            Command::Read | Command::Write if self.length > MAX_PAYLOAD => return Err(NBD_EINVAL),
            Command::BlockStatus if n.meta_context.is_none() || self.length == 0 => {
                return Err(NBD_EINVAL)
            }
            _ => {}
        }
        let in_bounds = self
            .offset
            .checked_add(u64::from(self.length))
            .is_some_and(|end| end <= n.size);
        if !in_bounds {
            // The protocol's SHOULDs: ENOSPC for writes past the end, EINVAL otherwise.
            return Err(match cmd {
                Command::Write | Command::WriteZeroes => NBD_ENOSPC,
                _ => NBD_EINVAL,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn negotiated(structured: bool, meta: bool) -> Negotiated {
        Negotiated {
            name: "d".into(),
            size: 1 << 20,
            flags: 0,
            structured,
            meta_context: meta.then_some(BASE_ALLOCATION_ID),
        }
    }

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn test_decode_known_bytes() {
        let mut b = [0u8; 28];
        b[..4].copy_from_slice(&[0x25, 0x60, 0x95, 0x13]);
        b[4..6].copy_from_slice(&[0, 1]);
        b[6..8].copy_from_slice(&[0, 1]);
        b[15] = 9;
        b[23] = 2;
        b[27] = 4;
        let r = Request::decode(&b).unwrap();
        assert_eq!(r, req(Command::Write, 1, 2, 4).with_cookie(9));
        assert!(r.fua());
        assert_eq!(r.payload_len(), 4);
        b[0] = 0;
        assert!(Request::decode(&b).is_err());
    }

    impl Request {
        fn with_cookie(mut self, c: u64) -> Self {
            self.cookie = c;
            self
        }
    }

    #[test]
    fn test_check_bounds_and_limits() {
        let n = negotiated(true, true);
        assert_eq!(req(Command::Read, 0, 0, 4096).check(&n), Ok(()));
        assert_eq!(req(Command::Read, 0, (1 << 20) - 1, 1).check(&n), Ok(()));
        assert_eq!(req(Command::Read, 0, 1 << 20, 1).check(&n), Err(NBD_EINVAL));
        assert_eq!(
            req(Command::Read, 0, u64::MAX, 2).check(&n),
            Err(NBD_EINVAL)
        );
        assert_eq!(
            req(Command::Write, 0, 1 << 20, 1).check(&n),
            Err(NBD_ENOSPC)
        );
        assert_eq!(
            req(Command::WriteZeroes, 0, 1 << 20, 1).check(&n),
            Err(NBD_ENOSPC)
        );
        assert_eq!(req(Command::Trim, 0, 1 << 20, 1).check(&n), Err(NBD_EINVAL));
        assert_eq!(
            req(Command::Read, 0, 0, MAX_PAYLOAD + 1).check(&n),
            Err(NBD_EINVAL)
        );
        assert_eq!(req(Command::Flush, 0, 99, 99).check(&n), Ok(()));
        assert_eq!(
            req(Command::Unknown(42), 0, 0, 0).check(&n),
            Err(NBD_EINVAL)
        );
    }

    #[test]
    fn test_check_command_flags() {
        let n = negotiated(true, true);
        let fz = NBD_CMD_FLAG_FAST_ZERO | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FUA;
        assert_eq!(req(Command::WriteZeroes, fz, 0, 512).check(&n), Ok(()));
        assert_eq!(
            req(Command::Write, NBD_CMD_FLAG_NO_HOLE, 0, 1).check(&n),
            Err(NBD_EINVAL)
        );
        assert_eq!(req(Command::Read, NBD_CMD_FLAG_DF, 0, 1).check(&n), Ok(()));
        let simple = negotiated(false, false);
        assert_eq!(
            req(Command::Read, NBD_CMD_FLAG_DF, 0, 1).check(&simple),
            Err(NBD_EINVAL)
        );
        assert_eq!(req(Command::Cache, 1 << 9, 0, 1).check(&n), Err(NBD_EINVAL));
        assert_eq!(
            req(Command::Flush, NBD_CMD_FLAG_FUA, 0, 0).check(&n),
            Ok(())
        );
    }

    #[test]
    fn test_block_status_needs_a_context() {
        let q = req(Command::BlockStatus, NBD_CMD_FLAG_REQ_ONE, 0, 4096);
        assert_eq!(q.check(&negotiated(true, true)), Ok(()));
        assert_eq!(q.check(&negotiated(true, false)), Err(NBD_EINVAL));
        let zero = req(Command::BlockStatus, 0, 0, 0);
        assert_eq!(zero.check(&negotiated(true, true)), Err(NBD_EINVAL));
    }

    fn any_request() -> impl Strategy<Value = Request> {
        (
            any::<u16>(),
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
        )
            .prop_map(|(flags, t, cookie, offset, length)| Request {
                flags,
                command: Command::from_wire(t),
                cookie,
                offset,
                length,
            })
    }

    proptest! {
        #[test]
        fn test_request_encode_decode_round_trip(r in any_request()) {
            prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
        }

        #[test]
        fn test_request_decode_garbage_never_panics(b in proptest::array::uniform28(any::<u8>())) {
            if let Ok(r) = Request::decode(&b) {
                prop_assert_eq!(r.encode(), b);
                let _ = r.check(&negotiated(true, true));
                let _ = r.check(&negotiated(false, false));
            }
        }
    }
}
