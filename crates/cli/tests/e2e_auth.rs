//! The admin API with tokens: a cluster from `drove up --auth` refuses requests
//! without a token or with an unknown one, lets each role (read-only, operator,
//! admin) do what it may and no more, and refuses a deleted token at once. Real
//! node processes on 127.0.0.1, the real CLI and curl.
mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

/// `drove ARGS` through node `i` with `token` as DROVE_TOKEN (and no token file).
fn drove_as(c: &Cluster, i: usize, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(drove_bin());
    cmd.args(args)
        .args(["--cluster", &c.nodes[i].admin])
        .env_remove("DROVE_TOKEN_FILE")
        .env_remove("DROVE_TOKEN");
    if let Some(t) = token {
        cmd.env("DROVE_TOKEN", t);
    }
    run(&mut cmd)
}

/// The HTTP status curl gets for `METHOD path` on node 1, with `token`.
fn http_status(c: &Cluster, method: &str, path: &str, token: Option<&str>) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method])
        .arg(format!("http://{}{path}", c.nodes[0].admin));
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    String::from_utf8_lossy(&run(&mut cmd).stdout).into_owned()
}

#[test]
fn test_the_admin_api_takes_only_tokens_and_each_role_does_what_it_may() {
    if !require(&["curl"]) {
        return;
    }
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 2, 2, &["--auth"]);
    let file = c.nodes[0]
        .admin_token_file
        .clone()
        .expect("cluster.json names the token file");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{file}");
    assert!(
        c.nodes
            .iter()
            .all(|n| n.admin_token_file.as_deref() == Some(file.as_str())),
        "every node gets the same token file"
    );
    let admin = std::fs::read_to_string(&file).unwrap().trim().to_string();

    // The kit sends the admin token (DROVE_TOKEN_FILE): the cluster works, and the
    // nodes answer each other's health questions (they send the same token).
    c.create_vdi("vm", "16M", &[]);
    let h = c.drove(0, &["cluster", "health", "--json"]);
    let hj: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
    assert!(
        !hj["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["check"] == "reach"),
        "a node could not ask the other: {hj}"
    );

    // No token, an unknown token: refused, saying what to do.
    let o = drove_as(&c, 0, None, &["vdi", "list"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("DROVE_TOKEN"), "{}", text(&o));
    let o = drove_as(&c, 0, Some("drove_0000"), &["vdi", "list"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("Unknown or deleted"), "{}", text(&o));
    for (m, p) in [
        ("GET", "/api/status"),
        ("GET", "/metrics"),
        ("GET", "/api/vdis/vm"),
        ("DELETE", "/api/vdis/vm"),
        ("POST", "/api/settings"),
        ("GET", "/api/tokens"),
        ("GET", "/api/local/health"),
    ] {
        assert_eq!(http_status(&c, m, p, None), "401", "{m} {p}");
    }
    assert_eq!(
        c.vdi_names(),
        vec!["vm".to_string()],
        "the refused delete happened"
    );
    // A joining node still gets the public hello (it then needs a peer certificate
    // on a cluster with TLS).
    assert_eq!(http_status(&c, "GET", "/meta/hello", None), "200");

    // Tokens are made with the admin token and shown once.
    let make = |name: &str, role: &str| -> String {
        let o = drove_as(
            &c,
            0,
            Some(&admin),
            &["token", "create", name, "--role", role, "--json"],
        );
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["role"], role, "{v}");
        v["token"].as_str().unwrap().to_string()
    };
    let ro = make("monitor", "read-only");
    let op = make("openstack", "operator");
    let o = drove_as(&c, 0, Some(&admin), &["token", "list", "--json"]);
    let list = text(&o);
    assert!(o.status.success(), "{list}");
    assert!(
        list.contains("monitor") && list.contains("openstack"),
        "{list}"
    );
    assert!(
        !list.contains(&ro) && !list.contains(&op),
        "a secret in the list: {list}"
    );
    let o = drove_as(
        &c,
        0,
        Some(&admin),
        &["token", "create", "a/b", "--role", "admin"],
    );
    assert!(!o.status.success(), "a bad name was taken");

    // read-only: reads and metrics, nothing else.
    assert!(drove_as(&c, 0, Some(&ro), &["vdi", "list"])
        .status
        .success());
    assert!(drove_as(&c, 0, Some(&ro), &["cluster", "status"])
        .status
        .success());
    assert_eq!(http_status(&c, "GET", "/metrics", Some(&ro)), "200");
    let o = drove_as(&c, 0, Some(&ro), &["vdi", "create", "x", "1M"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("read-only") && t.contains("needs operator"),
        "{t}"
    );
    assert_eq!(http_status(&c, "GET", "/api/tokens", Some(&ro)), "403");

    // operator: creates VDIs, snapshots and clones; no delete, settings or tokens.
    for args in [
        &["vdi", "create", "web", "16M"][..],
        &["vdi", "snapshot", "web", "gold"],
        &["vdi", "clone", "gold", "web2"],
    ] {
        let o = drove_as(&c, 0, Some(&op), args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
    let o = drove_as(&c, 0, Some(&op), &["vdi", "delete", "web2"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("needs admin"), "{}", text(&o));
    let o = drove_as(&c, 0, Some(&op), &["cluster", "config", "--copies", "1"]);
    assert!(!o.status.success(), "{}", text(&o));
    let o = drove_as(
        &c,
        0,
        Some(&op),
        &["token", "create", "mine", "--role", "admin"],
    );
    assert!(
        !o.status.success(),
        "an operator made a token: {}",
        text(&o)
    );

    // A token made through node 1 works on node 2 (the metadata has it, once
    // node 2 has applied the entry).
    wait_until(
        std::time::Duration::from_secs(10),
        "node 2 to take the operator token",
        || {
            drove_as(&c, 1, Some(&op), &["vdi", "list"])
                .status
                .success()
        },
    );

    // admin: deletes; a deleted token is refused at once.
    let o = drove_as(&c, 0, Some(&admin), &["vdi", "delete", "web2"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = drove_as(&c, 0, Some(&admin), &["token", "delete", "monitor"]);
    assert!(o.status.success(), "{}", text(&o));
    // Through both nodes, once each has applied the deletion.
    for i in 0..2 {
        wait_until(
            std::time::Duration::from_secs(10),
            "the deleted token to be refused",
            || {
                let o = drove_as(&c, i, Some(&ro), &["vdi", "list"]);
                !o.status.success() && text(&o).contains("Unknown or deleted")
            },
        );
    }
}
