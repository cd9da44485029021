//! The fixed newstyle negotiation as a sans-IO state machine: the first thing a client
//! meets on the NBD side of the data path. It takes parsed options (and what the
//! catalogue said about the export they name) and returns the reply bytes plus what to
//! do next; `session.rs` moves the bytes and performs the look-ups.
//!
//! Flow per option: `lookup(&opt)` says whether the session must list or open an export
//! first; the session does so and passes the result to `handle(&opt, found)`.
use crate::option::{put_error, put_reply, ClientOption, InfoRequest, MetaRequest};
use crate::proto::*;
use bytes::{BufMut, BytesMut};
use drove_types::ErrorKind;

/// Options one connection may send before we decide it is not negotiating in good faith.
pub const MAX_OPTIONS: u32 = 4096;

/// The server's opening: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut g = [0u8; 18];
    g[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    g[16..].copy_from_slice(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
    g
}

/// The transmission flags we advertise: everything the [`crate::Export`] trait can do,
/// `SEND_DF` only with structured replies (we always send one content chunk), and
/// `CAN_MULTI_CONN` only when the export shares its cache across connections.
pub fn transmission_flags(structured: bool, multi_conn: bool) -> u16 {
    let mut f = NBD_FLAG_HAS_FLAGS
        | NBD_FLAG_SEND_FLUSH
        | NBD_FLAG_SEND_FUA
        | NBD_FLAG_SEND_TRIM
        | NBD_FLAG_SEND_WRITE_ZEROES
        | NBD_FLAG_SEND_FAST_ZERO
        | NBD_FLAG_SEND_CACHE;
    if structured {
        f |= NBD_FLAG_SEND_DF;
    }
    if multi_conn {
        f |= NBD_FLAG_CAN_MULTI_CONN;
    }
    f
}

/// [`transmission_flags`] plus `NBD_FLAG_READ_ONLY` for a read-only export.
fn flags_for(structured: bool, facts: &ExportFacts) -> u16 {
    let f = transmission_flags(structured, facts.multi_conn);
    if facts.read_only {
        f | crate::proto::NBD_FLAG_READ_ONLY
    } else {
        f
    }
}

/// What the session must fetch from the catalogue before `handle` can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Nothing: the option is answered from negotiation state alone.
    Nothing,
    /// The list of exports.
    List,
    /// Open the named export; `description` asks for its description too.
    Export {
        /// Export name.
        name: String,
        /// The client asked for `NBD_INFO_DESCRIPTION`.
        description: bool,
    },
}

/// What an open export told the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportFacts {
    /// Size in bytes.
    pub size: u64,
    /// Whether `NBD_FLAG_CAN_MULTI_CONN` may be advertised.
    pub multi_conn: bool,
    /// Advertise `NBD_FLAG_READ_ONLY` (a snapshot); writes are refused with EPERM.
    pub read_only: bool,
    /// Description, when asked for and known.
    pub description: Option<String>,
}

/// The answer to a [`Lookup`].
#[derive(Debug)]
pub enum Found {
    /// For [`Lookup::Nothing`].
    Nothing,
    /// For [`Lookup::List`].
    List(drove_types::Result<Vec<(String, String)>>),
    /// For [`Lookup::Export`].
    Export(drove_types::Result<ExportFacts>),
}

/// The parameters of the transmission phase, fixed at the end of negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Export name.
    pub name: String,
    /// Export size in bytes.
    pub size: u64,
    /// Transmission flags sent to the client.
    pub flags: u16,
    /// Structured replies are in use.
    pub structured: bool,
    /// Context id of `base:allocation` if the client selected it for this export.
    pub meta_context: Option<u32>,
}

/// What the session does after sending the reply bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Read the next option.
    Continue,
    /// The client aborted; close quietly.
    Abort,
    /// Close the connection: the client broke the protocol or picked an export with
    /// `NBD_OPT_EXPORT_NAME` that cannot be served (that option cannot carry an error).
    Reject(String),
    /// Enter the transmission phase.
    Transmit(Negotiated),
    /// The ACK to `NBD_OPT_STARTTLS` is in the replies: send it, run the TLS
    /// handshake as the server, and go on reading options over TLS.
    StartTls,
}

/// Reply bytes to send, then what to do.
#[derive(Debug)]
pub struct Outcome {
    /// Encoded replies, possibly empty.
    pub replies: BytesMut,
    /// The next step.
    pub next: Next,
}

/// Whether a listener offers TLS (`NBD_OPT_STARTTLS`), and whether it insists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: STARTTLS is refused with `NBD_REP_ERR_POLICY` (the unix socket, or a
    /// node without certificates).
    #[default]
    Off,
    /// Plaintext and TLS clients alike.
    Allow,
    /// The protocol's FORCEDTLS: before STARTTLS, every option but ABORT is answered
    /// `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` (which cannot carry an
    /// error) closes the connection.
    Require,
}

/// The client sent handshake flags we do not know or did not offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadClientFlags(pub u32);

/// Negotiation state of one connection.
#[derive(Debug)]
pub struct Negotiation {
    no_zeroes: bool,
    structured: bool,
    /// Export name of the last successful `base:allocation` selection.
    meta_for: Option<String>,
    options: u32,
    tls: TlsMode,
    /// STARTTLS was acknowledged: options now arrive over TLS.
    tls_active: bool,
}

impl Negotiation {
    /// Start negotiating after the client's flags. Unknown flags must close the
    /// connection (the protocol says so). A client without `C_FIXED_NEWSTYLE` is still
    /// served: plain newstyle clients only send `NBD_OPT_EXPORT_NAME`, which we answer the
    /// same way.
    pub fn new(client_flags: u32) -> Result<Self, BadClientFlags> {
        Self::with_tls(client_flags, TlsMode::Off)
    }

    /// [`Negotiation::new`] on a listener that offers TLS as `tls` says.
    pub fn with_tls(client_flags: u32, tls: TlsMode) -> Result<Self, BadClientFlags> {
        if client_flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
            return Err(BadClientFlags(client_flags));
        }
        Ok(Negotiation {
            no_zeroes: client_flags & NBD_FLAG_C_NO_ZEROES != 0,
            structured: false,
            meta_for: None,
            options: 0,
            tls,
            tls_active: false,
        })
    }

    /// Whether options from here on must be refused until the client starts TLS.
    fn tls_required(&self) -> bool {
        self.tls == TlsMode::Require && !self.tls_active
    }

    /// What the session must fetch before handling `opt`.
    pub fn lookup(&self, opt: &ClientOption) -> Lookup {
        if self.tls_required() {
            // Nothing is looked up for a client that has not proved who it is: not
            // even whether an export exists.
            return Lookup::Nothing;
        }
        match opt {
            ClientOption::List => Lookup::List,
            ClientOption::ExportName(name) => Lookup::Export {
                name: name.clone(),
                description: false,
            },
            ClientOption::Info(req) | ClientOption::Go(req) => Lookup::Export {
                name: req.name.clone(),
                description: req.items.contains(&NBD_INFO_DESCRIPTION),
            },
            _ => Lookup::Nothing,
        }
    }

    /// The reply to an option whose data was longer than [`MAX_OPTION_LEN`]; the session
    /// closes the connection after sending it rather than read that much.
    pub fn too_big(code: u32) -> BytesMut {
        let mut out = BytesMut::new();
        put_error(&mut out, code, NBD_REP_ERR_TOO_BIG, "option data too long");
        out
    }

    /// Answer `opt`, given what the catalogue returned for [`Negotiation::lookup`].
    pub fn handle(&mut self, opt: &ClientOption, found: Found) -> Outcome {
        let mut out = BytesMut::new();
        self.options += 1;
        if self.options > MAX_OPTIONS {
            return done(out, Next::Reject("too many options".into()));
        }
        let code = opt.code();
        if let ClientOption::StartTls = opt {
            return self.start_tls(out);
        }
        if self.tls_required() {
            return self.tls_required_reply(out, opt);
        }
        let next = match opt {
            ClientOption::ExportName(name) => return self.export_name(name, found),
            ClientOption::Invalid {
                code: NBD_OPT_EXPORT_NAME,
                reason,
            } => Next::Reject(format!("NBD_OPT_EXPORT_NAME: {reason}")),
            ClientOption::Abort => {
                put_reply(&mut out, code, NBD_REP_ACK, &[]);
                Next::Abort
            }
            ClientOption::List => {
                list(&mut out, found);
                Next::Continue
            }
            ClientOption::StructuredReply => {
                self.structured = true;
                put_reply(&mut out, code, NBD_REP_ACK, &[]);
                Next::Continue
            }
            ClientOption::Info(req) => {
                self.info(&mut out, code, req, found);
                Next::Continue
            }
            ClientOption::Go(req) => match self.info(&mut out, code, req, found) {
                Some(facts) => Next::Transmit(self.negotiated(&req.name, &facts)),
                None => Next::Continue,
            },
            ClientOption::SetMetaContext(req) => {
                self.set_meta(&mut out, code, req);
                Next::Continue
            }
            ClientOption::ListMetaContext(req) => {
                self.list_meta(&mut out, code, req);
                Next::Continue
            }
            ClientOption::Invalid { reason, .. } => {
                put_error(&mut out, code, NBD_REP_ERR_INVALID, reason);
                Next::Continue
            }
            ClientOption::Unsupported(_) => {
                put_error(&mut out, code, NBD_REP_ERR_UNSUP, "option not supported");
                Next::Continue
            }
            // Answered above.
            ClientOption::StartTls => Next::Continue,
        };
        done(out, next)
    }

    fn start_tls(&mut self, mut out: BytesMut) -> Outcome {
        let code = NBD_OPT_STARTTLS;
        if self.tls == TlsMode::Off {
            put_error(
                &mut out,
                code,
                NBD_REP_ERR_POLICY,
                "TLS is not offered here",
            );
            return done(out, Next::Continue);
        }
        if self.tls_active {
            put_error(&mut out, code, NBD_REP_ERR_INVALID, "TLS is already on");
            return done(out, Next::Continue);
        }
        self.tls_active = true;
        // The protocol: no per-export state survives the upgrade (an attacker could
        // have injected it in plaintext). Structured replies are global and may stay.
        self.meta_for = None;
        put_reply(&mut out, code, NBD_REP_ACK, &[]);
        done(out, Next::StartTls)
    }

    /// The answer to anything but STARTTLS before TLS on a listener that requires it.
    fn tls_required_reply(&mut self, mut out: BytesMut, opt: &ClientOption) -> Outcome {
        let next = match opt {
            // It cannot carry an error reply: the protocol says to close.
            ClientOption::ExportName(_)
            | ClientOption::Invalid {
                code: NBD_OPT_EXPORT_NAME,
                ..
            } => Next::Reject("NBD_OPT_EXPORT_NAME before STARTTLS: TLS is required".into()),
            ClientOption::Abort => {
                put_reply(&mut out, NBD_OPT_ABORT, NBD_REP_ACK, &[]);
                Next::Abort
            }
            ClientOption::Invalid {
                code: NBD_OPT_STARTTLS,
                reason,
            } => {
                put_error(&mut out, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID, reason);
                Next::Continue
            }
            _ => {
                put_error(
                    &mut out,
                    opt.code(),
                    NBD_REP_ERR_TLS_REQD,
                    "TLS is required: use NBD_OPT_STARTTLS",
                );
                Next::Continue
            }
        };
        done(out, next)
    }

    fn negotiated(&self, name: &str, facts: &ExportFacts) -> Negotiated {
        // base:allocation counts only if the last SET_META_CONTEXT named this export.
        let meta = self.structured && self.meta_for.as_deref() == Some(name);
        Negotiated {
            name: name.to_owned(),
            size: facts.size,
            flags: flags_for(self.structured, facts),
            structured: self.structured,
            meta_context: meta.then_some(BASE_ALLOCATION_ID),
        }
    }

    fn export_name(&self, name: &str, found: Found) -> Outcome {
        let mut out = BytesMut::new();
        let facts = match found {
            Found::Export(Ok(facts)) => facts,
            Found::Export(Err(e)) => {
                return done(out, Next::Reject(format!("export '{name}': {e}")))
            }
            _ => return done(out, Next::Reject(format!("export '{name}' was not opened"))),
        };
        let n = self.negotiated(name, &facts);
        out.put_u64(n.size);
        out.put_u16(n.flags);
        if !self.no_zeroes {
            out.put_bytes(0, 124);
        }
        done(out, Next::Transmit(n))
    }

    /// Replies to INFO/GO; returns the facts when the reply ended in `NBD_REP_ACK`.
    fn info(
        &self,
        out: &mut BytesMut,
        code: u32,
        req: &InfoRequest,
        found: Found,
    ) -> Option<ExportFacts> {
        let facts = match found {
            Found::Export(Ok(facts)) => facts,
            Found::Export(Err(e)) => {
                put_error(out, code, rep_err_for(e.kind()), &e.to_string());
                return None;
            }
            _ => {
                put_error(out, code, NBD_REP_ERR_UNKNOWN, "export not opened");
                return None;
            }
        };
        let flags = flags_for(self.structured, &facts);
        let mut item = BytesMut::new();
        item.put_u16(NBD_INFO_EXPORT);
        item.put_u64(facts.size);
        item.put_u16(flags);
        put_reply(out, code, NBD_REP_INFO, &item.split());
        // Sent whether asked or not: these are the protocol's default constraints, so a
        // client that ignores them loses nothing.
        item.put_u16(NBD_INFO_BLOCK_SIZE);
        item.put_u32(MIN_BLOCK_SIZE);
        item.put_u32(PREFERRED_BLOCK_SIZE);
        item.put_u32(MAX_PAYLOAD);
        put_reply(out, code, NBD_REP_INFO, &item.split());
        if req.items.contains(&NBD_INFO_NAME) {
            item.put_u16(NBD_INFO_NAME);
            item.put_slice(req.name.as_bytes());
            put_reply(out, code, NBD_REP_INFO, &item.split());
        }
        if let Some(desc) = facts.description.as_deref().filter(|d| !d.is_empty()) {
            if req.items.contains(&NBD_INFO_DESCRIPTION) {
                item.put_u16(NBD_INFO_DESCRIPTION);
                item.put_slice(crate::option::truncate(desc).as_bytes());
                put_reply(out, code, NBD_REP_INFO, &item.split());
            }
        }
        put_reply(out, code, NBD_REP_ACK, &[]);
        Some(facts)
    }

    fn set_meta(&mut self, out: &mut BytesMut, code: u32, req: &MetaRequest) {
        // The protocol: this option replaces the selection even when it fails.
        self.meta_for = None;
        if !self.structured {
            put_error(
                out,
                code,
                NBD_REP_ERR_INVALID,
                "negotiate structured replies first",
            );
            return;
        }
        // `base:` alone selects nothing here (wildcards are for LIST only); unknown
        // namespaces and leaves are ignored, as the protocol requires.
        if req.queries.iter().any(|q| q == BASE_ALLOCATION) {
            self.meta_for = Some(req.name.clone());
            put_meta_context(out, code, BASE_ALLOCATION_ID);
        }
        put_reply(out, code, NBD_REP_ACK, &[]);
    }

    fn list_meta(&self, out: &mut BytesMut, code: u32, req: &MetaRequest) {
        if !self.structured {
            put_error(
                out,
                code,
                NBD_REP_ERR_INVALID,
                "negotiate structured replies first",
            );
            return;
        }
        let matches = req.queries.is_empty()
            || req
                .queries
                .iter()
                .any(|q| q == "base:" || q == BASE_ALLOCATION);
        if matches {
            // The id in LIST replies is reserved and should be zero.
            put_meta_context(out, code, 0);
        }
        put_reply(out, code, NBD_REP_ACK, &[]);
    }
}

fn done(replies: BytesMut, next: Next) -> Outcome {
    Outcome { replies, next }
}

fn put_meta_context(out: &mut BytesMut, code: u32, id: u32) {
    let mut d = BytesMut::with_capacity(4 + BASE_ALLOCATION.len());
    d.put_u32(id);
    d.put_slice(BASE_ALLOCATION.as_bytes());
    put_reply(out, code, NBD_REP_META_CONTEXT, &d);
}

fn list(out: &mut BytesMut, found: Found) {
    let exports = match found {
        Found::List(Ok(list)) => list,
        Found::List(Err(e)) => {
            // No reply type fits "the catalogue failed"; POLICY ("known, valid, but
            // refused") is the closest, and the message says why.
            put_error(out, NBD_OPT_LIST, NBD_REP_ERR_POLICY, &e.to_string());
            return;
        }
        _ => Vec::new(),
    };
    for (name, desc) in exports {
        // A name we could not accept back in NBD_OPT_GO is not worth listing.
        if name.len() > MAX_STRING {
            continue;
        }
        let desc = crate::option::truncate(&desc);
        let mut d = BytesMut::with_capacity(4 + name.len() + desc.len());
        d.put_u32(name.len() as u32);
        d.put_slice(name.as_bytes());
        d.put_slice(desc.as_bytes());
        put_reply(out, NBD_OPT_LIST, NBD_REP_SERVER, &d);
    }
    put_reply(out, NBD_OPT_LIST, NBD_REP_ACK, &[]);
}

/// The option reply error for a failed export open.
fn rep_err_for(kind: ErrorKind) -> u32 {
    match kind {
        ErrorKind::Invalid => NBD_REP_ERR_INVALID,
        // NotFound, and anything else that kept us from opening it: "not available".
        _ => NBD_REP_ERR_UNKNOWN,
    }
}

#[cfg(test)]
#[path = "handshake_tests.rs"]
mod tests;
