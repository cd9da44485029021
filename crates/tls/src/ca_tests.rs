//! Issuing and reloading certificates; the files they land in.
use super::*;
use std::os::unix::fs::PermissionsExt;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn test_ca_written_then_loaded_issues_certificates() {
    let d = tempfile::tempdir().unwrap();
    let ca_dir = d.path().join("ca");
    let ca = Ca::generate("test-ca", 30).unwrap();
    let [cert, key] = ca.write(&ca_dir).unwrap();
    assert_eq!((mode(&cert), mode(&key)), (0o600, 0o600));
    assert_eq!(mode(&ca_dir), 0o700);
    // Writing again must not replace the key that signed everything.
    assert!(matches!(ca.write(&ca_dir), Err(Error::Exists { .. })));

    let loaded = Ca::load(&ca_dir).unwrap();
    assert_eq!(loaded.cert_pem(), ca.cert_pem());
    let names = NodeNames {
        name: "node1".into(),
        hosts: vec!["127.0.0.1".into(), "host.example".into(), "::1".into()],
    };
    let node = loaded.issue_node(&names, 10).unwrap();
    let paths = node.write_node(&loaded, &d.path().join("node1")).unwrap();
    for p in &paths {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    let der = crate::files::load_certs(&paths[1]).unwrap();
    let (_, x) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
    assert_eq!(crate::common_name(&der[0]).as_deref(), Some("node1"));
    assert!(!x.is_ca());
    let sans = format!("{:?}", x.subject_alternative_name().unwrap().unwrap().value);
    for want in ["drove-node", "host.example", "[127, 0, 0, 1]"] {
        assert!(sans.contains(want), "{want} not in {sans}");
    }
    let days_left = (node.not_after - OffsetDateTime::now_utc()).whole_days();
    assert!((9..=10).contains(&days_left), "{days_left}");

    // A client directory next to the CA's shares its ca-cert.pem.
    let client = loaded.issue_client("alice", 10).unwrap();
    client.write_client(&loaded, &ca_dir).unwrap();
    assert!(ca_dir.join(CLIENT_CERT).exists() && ca_dir.join(CLIENT_KEY).exists());
    // ... but a different CA's certificate there is not overwritten.
    let other = Ca::generate("other", 1).unwrap();
    let e = client.write_client(&other, &ca_dir).unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e}");
}

#[test]
fn test_load_refuses_a_key_that_is_not_the_cas() {
    let d = tempfile::tempdir().unwrap();
    let a = Ca::generate("a", 1).unwrap();
    let b = Ca::generate("b", 1).unwrap();
    a.write(&d.path().join("a")).unwrap();
    b.write(&d.path().join("b")).unwrap();
    std::fs::copy(
        d.path().join("b").join(CA_KEY),
        d.path().join("a").join(CA_KEY),
    )
    .unwrap();
    let e = Ca::load(&d.path().join("a")).unwrap_err();
    assert!(e.to_string().contains("not the key of"), "{e}");
}

#[test]
fn test_load_refuses_a_leaf_certificate_as_ca() {
    let d = tempfile::tempdir().unwrap();
    let ca = Ca::generate("a", 1).unwrap();
    let c = ca.issue_client("bob", 1).unwrap();
    let dir = d.path().join("fake");
    crate::files::create_dir(&dir).unwrap();
    crate::files::write_private(&dir.join(CA_CERT), &c.cert_pem, false).unwrap();
    crate::files::write_private(&dir.join(CA_KEY), &c.key_pem, false).unwrap();
    let e = Ca::load(&dir).unwrap_err();
    assert!(e.to_string().contains("not a CA certificate"), "{e}");
}

#[test]
fn test_bad_names_and_hosts_are_refused() {
    let ca = Ca::generate("a", 1).unwrap();
    for name in ["", "has space", "a/b", &"x".repeat(65), "naïve"] {
        assert!(
            matches!(ca.issue_client(name, 1), Err(Error::BadName { .. })),
            "{name:?}"
        );
    }
    for host in ["", "a..b", "bad_host", "-x.", &"a".repeat(64)] {
        let names = NodeNames {
            name: "n".into(),
            hosts: vec![host.to_string()],
        };
        assert!(
            matches!(ca.issue_node(&names, 1), Err(Error::BadName { .. })),
            "{host:?}"
        );
    }
}
