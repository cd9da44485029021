//! Option haggling on the wire: parsing the client's option frames into [`ClientOption`]
//! values and encoding the server's option replies. Pure functions over bytes; the
//! negotiation logic that decides *which* replies to send is in `handshake.rs`, and the
//! socket glue in `session.rs`.
use crate::proto::*;
use crate::wire::Reader;
use bytes::{BufMut, BytesMut};

/// The fixed 16-byte header in front of every option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// Option code (`NBD_OPT_*`).
    pub code: u32,
    /// Length of the option data that follows.
    pub len: u32,
}

/// The option header did not start with `IHAVEOPT`: the peer is not an NBD client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadOptionMagic(pub u64);

/// Parse an option header.
pub fn parse_option_header(buf: &[u8; 16]) -> Result<OptionHeader, BadOptionMagic> {
    let mut r = Reader::new(buf);
    // A 16-byte array always holds these three fields; the defaults are unreachable.
    let magic = r.u64().unwrap_or_default();
    let code = r.u32().unwrap_or_default();
    let len = r.u32().unwrap_or_default();
    if magic != IHAVEOPT {
        return Err(BadOptionMagic(magic));
    }
    Ok(OptionHeader { code, len })
}

/// Encode an option header (client side; used by tests and tools).
pub fn encode_option(code: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&code.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// The export name and information requests of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name (empty = default export).
    pub name: String,
    /// `NBD_INFO_*` items the client asks for.
    pub items: Vec<u16>,
}

/// The export name and queries of `NBD_OPT_{LIST,SET}_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    /// Export name the contexts are for.
    pub name: String,
    /// Query strings, like `base:allocation` or `base:`.
    pub queries: Vec<String>,
}

/// One option, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`.
    ExportName(String),
    /// `NBD_OPT_ABORT` (any data is ignored, as the protocol asks).
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaRequest),
    /// A known option whose data is malformed; answered with `NBD_REP_ERR_INVALID`.
    Invalid {
        /// The option code.
        code: u32,
        /// Why, for the error message.
        reason: &'static str,
    },
    /// An option this server does not implement; answered with `NBD_REP_ERR_UNSUP`.
    Unsupported(u32),
}

impl ClientOption {
    /// Parse the data of option `code`. Never panics, whatever `data` holds.
    pub fn parse(code: u32, data: &[u8]) -> ClientOption {
        let invalid = |reason| ClientOption::Invalid { code, reason };
        match code {
            NBD_OPT_EXPORT_NAME => match Reader::new(data).string(data.len()) {
                Some(name) => ClientOption::ExportName(name),
                None => invalid("export name is not UTF-8 or too long"),
            },
            NBD_OPT_ABORT => ClientOption::Abort,
            NBD_OPT_LIST if data.is_empty() => ClientOption::List,
            NBD_OPT_LIST => invalid("NBD_OPT_LIST takes no data"),
            NBD_OPT_STARTTLS if data.is_empty() => ClientOption::StartTls,
            NBD_OPT_STARTTLS => invalid("NBD_OPT_STARTTLS takes no data"),
            NBD_OPT_STRUCTURED_REPLY if data.is_empty() => ClientOption::StructuredReply,
            NBD_OPT_STRUCTURED_REPLY => invalid("NBD_OPT_STRUCTURED_REPLY takes no data"),
            NBD_OPT_INFO | NBD_OPT_GO => match parse_info(data) {
                Some(req) if code == NBD_OPT_GO => ClientOption::Go(req),
                Some(req) => ClientOption::Info(req),
                None => invalid("malformed export name or information requests"),
            },
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => match parse_meta(data) {
                Some(req) if code == NBD_OPT_SET_META_CONTEXT => ClientOption::SetMetaContext(req),
                Some(req) => ClientOption::ListMetaContext(req),
                None => invalid("malformed export name or queries"),
            },
            other => ClientOption::Unsupported(other),
        }
    }

    /// The option code this value was parsed from (echoed in every reply).
    pub fn code(&self) -> u32 {
        match self {
            ClientOption::ExportName(_) => NBD_OPT_EXPORT_NAME,
            ClientOption::Abort => NBD_OPT_ABORT,
            ClientOption::List => NBD_OPT_LIST,
            ClientOption::StartTls => NBD_OPT_STARTTLS,
            ClientOption::Info(_) => NBD_OPT_INFO,
            ClientOption::Go(_) => NBD_OPT_GO,
            ClientOption::StructuredReply => NBD_OPT_STRUCTURED_REPLY,
            ClientOption::ListMetaContext(_) => NBD_OPT_LIST_META_CONTEXT,
            ClientOption::SetMetaContext(_) => NBD_OPT_SET_META_CONTEXT,
            ClientOption::Invalid { code, .. } | ClientOption::Unsupported(code) => *code,
        }
    }
}

fn parse_info(data: &[u8]) -> Option<InfoRequest> {
    let mut r = Reader::new(data);
    let name_len = r.u32()? as usize;
    let name = r.string(name_len)?;
    let count = r.u16()? as usize;
    // The item list must fill the rest exactly; this also bounds `count` by the data.
    if r.remaining() != count * 2 {
        return None;
    }
    let items = (0..count).map(|_| r.u16()).collect::<Option<Vec<_>>>()?;
    Some(InfoRequest { name, items })
}

fn parse_meta(data: &[u8]) -> Option<MetaRequest> {
    let mut r = Reader::new(data);
    let name_len = r.u32()? as usize;
    let name = r.string(name_len)?;
    let count = r.u32()? as usize;
    // Each query needs at least its 4-byte length: refuse counts the data cannot hold
    // before allocating for them.
    if count > r.remaining() / 4 {
        return None;
    }
    let mut queries = Vec::with_capacity(count);
    for _ in 0..count {
        let len = r.u32()? as usize;
        queries.push(r.string(len)?);
    }
    if r.remaining() != 0 {
        return None;
    }
    Some(MetaRequest { name, queries })
}

/// Append one option reply: magic, option, reply type, length, data.
pub fn put_reply(out: &mut BytesMut, option: u32, reply_type: u32, data: &[u8]) {
    out.put_u64(OPT_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply_type);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
}

/// Append an error reply with a human-readable message (cut to the protocol's limit).
pub fn put_error(out: &mut BytesMut, option: u32, reply_type: u32, msg: &str) {
    put_reply(out, option, reply_type, truncate(msg).as_bytes());
}

/// `msg` cut to at most [`MAX_STRING`] bytes on a character boundary.
pub(crate) fn truncate(msg: &str) -> &str {
    if msg.len() <= MAX_STRING {
        return msg;
    }
    let mut end = MAX_STRING;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    msg.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info_data(name: &str, items: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(items.len() as u16).to_be_bytes());
        for i in items {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    #[test]
    fn test_parse_go_with_items() {
        let d = info_data("disk", &[NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME]);
        assert_eq!(
            ClientOption::parse(NBD_OPT_GO, &d),
            ClientOption::Go(InfoRequest {
                name: "disk".into(),
                items: vec![3, 1]
            })
        );
        // One byte short or one byte long: invalid.
        assert!(matches!(
            ClientOption::parse(NBD_OPT_INFO, &d[..d.len() - 1]),
            ClientOption::Invalid { .. }
        ));
        let mut long = d.clone();
        long.push(0);
        assert!(matches!(
            ClientOption::parse(NBD_OPT_INFO, &long),
            ClientOption::Invalid { .. }
        ));
    }

    #[test]
    fn test_parse_meta_context_queries() {
        let mut d = 1u32.to_be_bytes().to_vec();
        d.push(b'x');
        d.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:a"] {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        assert_eq!(
            ClientOption::parse(NBD_OPT_SET_META_CONTEXT, &d),
            ClientOption::SetMetaContext(MetaRequest {
                name: "x".into(),
                queries: vec!["base:allocation".into(), "qemu:dirty-bitmap:a".into()]
            })
        );
        // A query count far beyond the data is refused without allocating.
        let mut huge = 0u32.to_be_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            ClientOption::parse(NBD_OPT_LIST_META_CONTEXT, &huge),
            ClientOption::Invalid { .. }
        ));
    }

    #[test]
    fn test_parse_simple_options() {
        assert_eq!(ClientOption::parse(NBD_OPT_LIST, &[]), ClientOption::List);
        assert!(matches!(
            ClientOption::parse(NBD_OPT_LIST, &[1]),
            ClientOption::Invalid { .. }
        ));
        assert_eq!(
            ClientOption::parse(NBD_OPT_ABORT, &[1, 2]),
            ClientOption::Abort
        );
        assert_eq!(ClientOption::parse(99, &[1]), ClientOption::Unsupported(99));
        assert_eq!(
            ClientOption::parse(NBD_OPT_EXPORT_NAME, b"a"),
            ClientOption::ExportName("a".into())
        );
    }

    #[test]
    fn test_option_header_round_trip_and_bad_magic() {
        let b = encode_option(NBD_OPT_GO, &[1, 2, 3]);
        let head: [u8; 16] = b[..16].try_into().unwrap();
        assert_eq!(
            parse_option_header(&head),
            Ok(OptionHeader {
                code: NBD_OPT_GO,
                len: 3
            })
        );
        assert!(parse_option_header(&[0; 16]).is_err());
    }

    #[test]
    fn test_truncate_respects_char_boundaries() {
        let s = "é".repeat(MAX_STRING);
        let t = truncate(&s);
        assert!(t.len() <= MAX_STRING && t.len() >= MAX_STRING - 1);
        assert_eq!(truncate("short"), "short");
    }

    proptest::proptest! {
        #[test]
        fn test_parse_option_garbage_never_panics(code in 0u32..16, data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let opt = ClientOption::parse(code, &data);
            proptest::prop_assert_eq!(opt.code(), code);
        }
    }
}
