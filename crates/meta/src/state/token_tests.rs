//! Unit tests of the admin API token table: what the state machine refuses from
//! any proposer, and what it finds by hash.
use super::tokens::{MAX_TOKENS, MAX_TOKEN_NAME};
use super::*;
use drove_types::ErrorKind;

fn hash(c: char) -> String {
    std::iter::repeat_n(c, 64).collect()
}

fn add(name: &str, role: Role, sha256: &str) -> Command {
    Command::AddToken {
        name: name.into(),
        role,
        sha256: sha256.into(),
    }
}

#[test]
fn test_tokens_are_added_found_by_hash_and_removed() {
    let mut s = MetaState::default();
    s.apply(&add("ci", Role::ReadOnly, &hash('a')), 7).unwrap();
    s.apply(&add("ops", Role::Operator, &hash('b')), 7).unwrap();
    assert_eq!(s.token_by_hash(&hash('a')), Some(("ci", Role::ReadOnly)));
    assert_eq!(s.token_by_hash(&hash('b')), Some(("ops", Role::Operator)));
    assert_eq!(s.token_by_hash(&hash('c')), None);
    assert_eq!(s.tokens["ci"].created_ms, 7000);
    s.apply(&Command::RemoveToken { name: "ci".into() }, 8)
        .unwrap();
    assert_eq!(s.token_by_hash(&hash('a')), None);
    let e = s
        .apply(&Command::RemoveToken { name: "ci".into() }, 8)
        .unwrap_err();
    assert_eq!(e.0, ErrorKind::NotFound);
}

#[test]
fn test_bad_tokens_are_refused_and_change_nothing() {
    let mut s = MetaState::default();
    s.apply(&add("ci", Role::Admin, &hash('a')), 1).unwrap();
    let before = s.clone();
    let long = "x".repeat(MAX_TOKEN_NAME + 1);
    for (cmd, kind) in [
        (add("", Role::Admin, &hash('b')), ErrorKind::Invalid),
        (add(&long, Role::Admin, &hash('b')), ErrorKind::Invalid),
        (add("a b", Role::Admin, &hash('b')), ErrorKind::Invalid),
        (add("x", Role::Admin, "abc"), ErrorKind::Invalid),
        (add("x", Role::Admin, &hash('B')), ErrorKind::Invalid),
        (add("x", Role::Admin, &hash('g')), ErrorKind::Invalid),
        // The same secret twice would make the name a token answers to ambiguous.
        (add("x", Role::ReadOnly, &hash('a')), ErrorKind::Invalid),
        (
            add("ci", Role::ReadOnly, &hash('b')),
            ErrorKind::AlreadyExists,
        ),
    ] {
        let e = s.apply(&cmd, 2).unwrap_err();
        assert_eq!(e.0, kind, "{cmd:?}: {}", e.1);
        assert_eq!(s, before, "{cmd:?} changed the state");
    }
}

#[test]
fn test_the_token_table_is_bounded() {
    let mut s = MetaState::default();
    for i in 0..MAX_TOKENS {
        let h = format!("{i:064x}");
        s.apply(&add(&format!("t{i}"), Role::ReadOnly, &h), 1)
            .unwrap();
    }
    let e = s
        .apply(&add("one-more", Role::ReadOnly, &hash('f')), 1)
        .unwrap_err();
    assert_eq!(e.0, ErrorKind::Invalid, "{}", e.1);
    assert_eq!(s.tokens.len(), MAX_TOKENS);
}

#[test]
fn test_roles_are_ordered_and_named_as_the_cli_takes_them() {
    assert!(Role::ReadOnly < Role::Operator && Role::Operator < Role::Admin);
    for r in [Role::ReadOnly, Role::Operator, Role::Admin] {
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, format!("\"{}\"", r.name()));
    }
}

/// A token may be named as a client certificate may (`drove cert client --name`
/// takes `@`): the certificate of that name has the token's role.
#[test]
fn test_a_token_may_be_named_like_a_certificate_with_an_at_sign() {
    let mut s = MetaState::default();
    s.apply(&add("alice@example.com", Role::ReadOnly, &hash('a')), 1)
        .unwrap();
    assert_eq!(s.tokens["alice@example.com"].role, Role::ReadOnly);
    assert!(super::tokens::check_token_name("a@b").is_ok());
}
