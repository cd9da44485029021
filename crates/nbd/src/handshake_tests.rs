//! Negotiation replies for each option, checked byte by byte against the protocol.
use super::*;
use crate::wire::Reader;
use drove_types::Error;

/// Split reply bytes into `(option, reply type, data)` triples.
fn replies(b: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut r = Reader::new(b);
    let mut v = Vec::new();
    while r.remaining() > 0 {
        assert_eq!(r.u64(), Some(OPT_REPLY_MAGIC));
        let opt = r.u32().unwrap();
        let ty = r.u32().unwrap();
        let len = r.u32().unwrap() as usize;
        v.push((opt, ty, r.take(len).unwrap().to_vec()));
    }
    v
}

fn facts(size: u64, multi_conn: bool) -> Found {
    Found::Export(Ok(ExportFacts {
        size,
        multi_conn,
        read_only: false,
        description: Some("a disk".into()),
    }))
}

fn go(name: &str, items: &[u16]) -> ClientOption {
    ClientOption::Go(InfoRequest {
        name: name.into(),
        items: items.to_vec(),
    })
}

fn meta(name: &str, queries: &[&str]) -> MetaRequest {
    MetaRequest {
        name: name.into(),
        queries: queries.iter().map(|q| q.to_string()).collect(),
    }
}

fn structured() -> Negotiation {
    let mut n = Negotiation::new(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).unwrap();
    let o = n.handle(&ClientOption::StructuredReply, Found::Nothing);
    assert_eq!(
        replies(&o.replies),
        vec![(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, vec![])]
    );
    n
}

#[test]
fn test_greeting_bytes() {
    let g = greeting();
    assert_eq!(&g[..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    assert_eq!(&g[16..], &[0, 3]);
}

#[test]
fn test_unknown_client_flags_are_refused() {
    assert!(Negotiation::new(0).is_ok());
    assert!(Negotiation::new(3).is_ok());
    assert_eq!(Negotiation::new(4).unwrap_err(), BadClientFlags(4));
}

#[test]
fn test_export_name_sends_size_flags_and_zeroes_unless_no_zeroes() {
    let mut n = Negotiation::new(NBD_FLAG_C_FIXED_NEWSTYLE).unwrap();
    let opt = ClientOption::ExportName("d".into());
    assert_eq!(
        n.lookup(&opt),
        Lookup::Export {
            name: "d".into(),
            description: false
        }
    );
    let o = n.handle(&opt, facts(1 << 20, false));
    assert_eq!(o.replies.len(), 8 + 2 + 124);
    assert_eq!(&o.replies[..8], &(1u64 << 20).to_be_bytes());
    let flags = u16::from_be_bytes([o.replies[8], o.replies[9]]);
    assert_eq!(flags, transmission_flags(false, false));
    assert!(o.replies[10..].iter().all(|&b| b == 0));
    assert!(matches!(
        o.next,
        Next::Transmit(Negotiated {
            size: 1048576,
            structured: false,
            ..
        })
    ));

    let mut n = Negotiation::new(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).unwrap();
    let o = n.handle(&opt, facts(7, true));
    assert_eq!(o.replies.len(), 10);
    let flags = u16::from_be_bytes([o.replies[8], o.replies[9]]);
    assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);
}

#[test]
fn test_export_name_unknown_closes_without_reply() {
    let mut n = Negotiation::new(1).unwrap();
    let o = n.handle(
        &ClientOption::ExportName("x".into()),
        Found::Export(Err(Error::not_found("no such export"))),
    );
    assert!(o.replies.is_empty());
    assert!(matches!(o.next, Next::Reject(_)));
}

#[test]
fn test_go_replies_info_export_block_size_name_description_ack() {
    let mut n = structured();
    let opt = go(
        "disk",
        &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE],
    );
    assert_eq!(
        n.lookup(&opt),
        Lookup::Export {
            name: "disk".into(),
            description: true
        }
    );
    let o = n.handle(&opt, facts(4096 * 3, false));
    let r = replies(&o.replies);
    let flags = transmission_flags(true, false);
    let mut export = vec![0, 0];
    export.extend_from_slice(&(4096u64 * 3).to_be_bytes());
    export.extend_from_slice(&flags.to_be_bytes());
    let mut bs = vec![0, 3];
    for v in [1u32, 4096, 32 << 20] {
        bs.extend_from_slice(&v.to_be_bytes());
    }
    assert_eq!(
        r,
        vec![
            (NBD_OPT_GO, NBD_REP_INFO, export),
            (NBD_OPT_GO, NBD_REP_INFO, bs),
            (NBD_OPT_GO, NBD_REP_INFO, [&[0u8, 1][..], b"disk"].concat()),
            (
                NBD_OPT_GO,
                NBD_REP_INFO,
                [&[0u8, 2][..], b"a disk"].concat()
            ),
            (NBD_OPT_GO, NBD_REP_ACK, vec![]),
        ]
    );
    assert_ne!(flags & NBD_FLAG_SEND_DF, 0);
    match o.next {
        Next::Transmit(t) => {
            assert_eq!(t.name, "disk");
            assert!(t.structured);
            assert_eq!(t.meta_context, None);
        }
        other => panic!("expected transmit, got {other:?}"),
    }
}

#[test]
fn test_info_does_not_enter_transmission_and_unknown_export_errors() {
    let mut n = structured();
    let info = ClientOption::Info(InfoRequest {
        name: "disk".into(),
        items: vec![],
    });
    let o = n.handle(&info, facts(512, false));
    let r = replies(&o.replies);
    assert_eq!(r.len(), 3, "export, block size, ack");
    assert_eq!(r[2].1, NBD_REP_ACK);
    assert_eq!(o.next, Next::Continue);

    let o = n.handle(
        &go("nope", &[]),
        Found::Export(Err(Error::not_found("no export 'nope'"))),
    );
    let r = replies(&o.replies);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, NBD_REP_ERR_UNKNOWN);
    assert_eq!(r[0].2, b"no export 'nope'");
    assert_eq!(o.next, Next::Continue);
}

#[test]
fn test_list_replies_server_entries_then_ack() {
    let mut n = structured();
    assert_eq!(n.lookup(&ClientOption::List), Lookup::List);
    let list = vec![
        ("a".to_string(), "first".to_string()),
        ("bb".into(), String::new()),
    ];
    let o = n.handle(&ClientOption::List, Found::List(Ok(list)));
    assert_eq!(
        replies(&o.replies),
        vec![
            (
                NBD_OPT_LIST,
                NBD_REP_SERVER,
                [&[0u8, 0, 0, 1][..], b"afirst"].concat()
            ),
            (
                NBD_OPT_LIST,
                NBD_REP_SERVER,
                [&[0u8, 0, 0, 2][..], b"bb"].concat()
            ),
            (NBD_OPT_LIST, NBD_REP_ACK, vec![]),
        ]
    );
    let o = n.handle(
        &ClientOption::List,
        Found::List(Err(Error::unavailable("meta down"))),
    );
    assert_eq!(replies(&o.replies)[0].1, NBD_REP_ERR_POLICY);
}

#[test]
fn test_abort_acks_and_closes() {
    let mut n = structured();
    let o = n.handle(&ClientOption::Abort, Found::Nothing);
    assert_eq!(
        replies(&o.replies),
        vec![(NBD_OPT_ABORT, NBD_REP_ACK, vec![])]
    );
    assert_eq!(o.next, Next::Abort);
}

#[test]
fn test_unknown_option_is_unsupported() {
    let mut n = structured();
    let opt = ClientOption::Unsupported(42);
    let o = n.handle(&opt, Found::Nothing);
    let r = replies(&o.replies);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].0, r[0].1), (42, NBD_REP_ERR_UNSUP));
    assert_eq!(o.next, Next::Continue);
}

#[test]
fn test_invalid_option_gets_err_invalid() {
    let mut n = structured();
    let o = n.handle(&ClientOption::parse(NBD_OPT_LIST, &[1]), Found::Nothing);
    assert_eq!(replies(&o.replies)[0].1, NBD_REP_ERR_INVALID);
    assert_eq!(o.next, Next::Continue);
}

#[test]
fn test_set_meta_context_selects_base_allocation_for_that_export_only() {
    let mut n = structured();
    let opt = ClientOption::SetMetaContext(meta("disk", &["qemu:x", "base:allocation"]));
    let o = n.handle(&opt, Found::Nothing);
    let mut ctx = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
    ctx.extend_from_slice(b"base:allocation");
    assert_eq!(
        replies(&o.replies),
        vec![
            (NBD_OPT_SET_META_CONTEXT, NBD_REP_META_CONTEXT, ctx),
            (NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, vec![]),
        ]
    );
    // GO on another export: no context.
    let o = n.handle(&go("other", &[]), facts(512, false));
    assert!(matches!(
        o.next,
        Next::Transmit(Negotiated {
            meta_context: None,
            ..
        })
    ));
    // GO on the same export: the context is active.
    let o = n.handle(&go("disk", &[]), facts(512, false));
    assert!(matches!(
        o.next,
        Next::Transmit(Negotiated {
            meta_context: Some(BASE_ALLOCATION_ID),
            ..
        })
    ));
}

#[test]
fn test_set_meta_context_needs_structured_and_clears_selection() {
    let mut n = Negotiation::new(1).unwrap();
    let opt = ClientOption::SetMetaContext(meta("disk", &["base:allocation"]));
    let o = n.handle(&opt, Found::Nothing);
    assert_eq!(replies(&o.replies)[0].1, NBD_REP_ERR_INVALID);

    let mut n = structured();
    n.handle(&opt, Found::Nothing);
    // A later SET with no matching query deselects.
    let o = n.handle(
        &ClientOption::SetMetaContext(meta("disk", &["base:"])),
        Found::Nothing,
    );
    assert_eq!(
        replies(&o.replies),
        vec![(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, vec![])]
    );
    let o = n.handle(&go("disk", &[]), facts(512, false));
    assert!(matches!(
        o.next,
        Next::Transmit(Negotiated {
            meta_context: None,
            ..
        })
    ));
}

#[test]
fn test_list_meta_context_wildcards() {
    let mut n = structured();
    for queries in [&[][..], &["base:"][..], &["base:allocation"][..]] {
        let o = n.handle(
            &ClientOption::ListMetaContext(meta("d", queries)),
            Found::Nothing,
        );
        let r = replies(&o.replies);
        assert_eq!(r.len(), 2, "{queries:?}");
        assert_eq!(r[0].1, NBD_REP_META_CONTEXT);
        assert_eq!(&r[0].2[..4], &[0, 0, 0, 0]);
        assert_eq!(&r[0].2[4..], b"base:allocation");
    }
    let o = n.handle(
        &ClientOption::ListMetaContext(meta("d", &["qemu:"])),
        Found::Nothing,
    );
    assert_eq!(
        replies(&o.replies),
        vec![(NBD_OPT_LIST_META_CONTEXT, NBD_REP_ACK, vec![])]
    );
}

#[test]
fn test_too_many_options_rejects() {
    let mut n = structured();
    for _ in 1..MAX_OPTIONS {
        assert_eq!(
            n.handle(&ClientOption::StructuredReply, Found::Nothing)
                .next,
            Next::Continue
        );
    }
    let o = n.handle(&ClientOption::StructuredReply, Found::Nothing);
    assert!(matches!(o.next, Next::Reject(_)));
}

#[test]
fn test_too_big_reply() {
    let r = replies(&Negotiation::too_big(77));
    assert_eq!((r[0].0, r[0].1), (77, NBD_REP_ERR_TOO_BIG));
}

proptest::proptest! {
    #[test]
    fn test_negotiation_never_panics_on_garbage(
        opts in proptest::collection::vec(
            (0u32..12, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
            1..20,
        )
    ) {
        let mut n = Negotiation::new(3).unwrap();
        for (code, data) in opts {
            let opt = ClientOption::parse(code, &data);
            let found = match n.lookup(&opt) {
                Lookup::Nothing => Found::Nothing,
                Lookup::List => Found::List(Ok(vec![("a".into(), "b".into())])),
                Lookup::Export { .. } => facts(4096, true),
            };
            let o = n.handle(&opt, found);
            if !matches!(o.next, Next::Continue) {
                break;
            }
        }
    }
}

fn tls(mode: TlsMode) -> Negotiation {
    Negotiation::with_tls(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES, mode).unwrap()
}

/// The single reply type to `opt`, and what comes next.
fn answer(n: &mut Negotiation, opt: &ClientOption, found: Found) -> (u32, Next) {
    let o = n.handle(opt, found);
    let r = replies(&o.replies);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, opt.code());
    (r[0].1, o.next)
}

#[test]
fn test_starttls_without_tls_is_refused_by_policy() {
    let mut n = tls(TlsMode::Off);
    let (ty, next) = answer(&mut n, &ClientOption::StartTls, Found::Nothing);
    assert_eq!((ty, next), (NBD_REP_ERR_POLICY, Next::Continue));
    // Negotiation goes on in plaintext.
    let o = n.handle(&go("disk", &[]), facts(1 << 20, false));
    assert!(matches!(o.next, Next::Transmit(_)));
}

#[test]
fn test_tls_required_refuses_every_option_before_starttls() {
    let mut n = tls(TlsMode::Require);
    let refused = [
        ClientOption::List,
        ClientOption::StructuredReply,
        go("disk", &[]),
        ClientOption::Info(InfoRequest {
            name: "disk".into(),
            items: vec![],
        }),
        ClientOption::SetMetaContext(meta("disk", &[BASE_ALLOCATION])),
        ClientOption::ListMetaContext(meta("disk", &[])),
        ClientOption::Unsupported(42),
        ClientOption::parse(NBD_OPT_LIST, &[1]),
    ];
    for opt in refused {
        // Nothing is looked up for it: not even whether the export exists.
        assert_eq!(n.lookup(&opt), Lookup::Nothing, "{opt:?}");
        let (ty, next) = answer(&mut n, &opt, Found::Nothing);
        assert_eq!(
            (ty, next),
            (NBD_REP_ERR_TLS_REQD, Next::Continue),
            "{opt:?}"
        );
    }
    // EXPORT_NAME cannot carry an error: the connection is closed.
    for opt in [
        ClientOption::ExportName("disk".into()),
        ClientOption::parse(NBD_OPT_EXPORT_NAME, &[0xff]),
    ] {
        let o = tls(TlsMode::Require).handle(&opt, facts(1 << 20, false));
        assert!(o.replies.is_empty());
        assert!(matches!(o.next, Next::Reject(_)), "{:?}", o.next);
    }
    // ABORT is still honoured.
    let (ty, next) = answer(&mut n, &ClientOption::Abort, Found::Nothing);
    assert_eq!((ty, next), (NBD_REP_ACK, Next::Abort));
}

#[test]
fn test_starttls_then_negotiation_goes_on_and_a_second_is_invalid() {
    let mut n = tls(TlsMode::Require);
    let (ty, next) = answer(&mut n, &ClientOption::StartTls, Found::Nothing);
    assert_eq!((ty, next), (NBD_REP_ACK, Next::StartTls));
    let (ty, next) = answer(&mut n, &ClientOption::StartTls, Found::Nothing);
    assert_eq!((ty, next), (NBD_REP_ERR_INVALID, Next::Continue));
    let opt = go("disk", &[]);
    assert!(matches!(n.lookup(&opt), Lookup::Export { .. }));
    let o = n.handle(&opt, facts(1 << 20, false));
    assert!(matches!(o.next, Next::Transmit(ref t) if t.size == 1 << 20));
}

#[test]
fn test_starttls_with_data_is_invalid() {
    for mode in [TlsMode::Off, TlsMode::Allow, TlsMode::Require] {
        let mut n = tls(mode);
        let opt = ClientOption::parse(NBD_OPT_STARTTLS, &[0]);
        let (ty, next) = answer(&mut n, &opt, Found::Nothing);
        assert_eq!(
            (ty, next),
            (NBD_REP_ERR_INVALID, Next::Continue),
            "{mode:?}"
        );
    }
}

#[test]
fn test_tls_allowed_serves_plaintext_and_tls_clients() {
    let mut plain = tls(TlsMode::Allow);
    assert_eq!(
        answer(&mut plain, &ClientOption::List, Found::List(Ok(vec![]))).0,
        NBD_REP_ACK
    );
    let o = plain.handle(&go("disk", &[]), facts(4096, false));
    assert!(matches!(o.next, Next::Transmit(_)));
    let mut upgraded = tls(TlsMode::Allow);
    let (ty, next) = answer(&mut upgraded, &ClientOption::StartTls, Found::Nothing);
    assert_eq!((ty, next), (NBD_REP_ACK, Next::StartTls));
}

#[test]
fn test_starttls_forgets_the_meta_context_chosen_before() {
    let mut n = tls(TlsMode::Allow);
    n.handle(&ClientOption::StructuredReply, Found::Nothing);
    n.handle(
        &ClientOption::SetMetaContext(meta("disk", &[BASE_ALLOCATION])),
        Found::Nothing,
    );
    n.handle(&ClientOption::StartTls, Found::Nothing);
    let o = n.handle(&go("disk", &[]), facts(4096, false));
    match o.next {
        // Structured replies are global and survive; the context does not.
        Next::Transmit(t) => assert_eq!((t.structured, t.meta_context), (true, None)),
        other => panic!("{other:?}"),
    }
}
