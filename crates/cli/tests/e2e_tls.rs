//! NBD over TLS with real clients: a cluster from `drove up --tls` serves `nbds://`
//! to nbdinfo (libnbd/GnuTLS) and to qemu-io/qemu-img with `tls-creds-x509`, refuses
//! plaintext, certificate-less and foreign-CA clients on TCP, and keeps its unix
//! socket plaintext. `drove cert` makes the files for a node started by hand, and a
//! node with a bad TLS directory does not start. Only 127.0.0.1 is used.
mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CLIENTS: &[&str] = &["nbdinfo", "qemu-io", "qemu-img"];

fn tls_cluster() -> Cluster {
    Cluster::start_with(tempfile::tempdir().unwrap(), 2, 2, &["--tls"])
}

/// `nbds://127.0.0.1:PORT/VDI` of node `n`, with libnbd's certificate directory.
fn nbds(n: &Node, vdi: &str, certs: &Path) -> String {
    format!(
        "{}/{vdi}?tls-certificates={}",
        n.nbd_tcp.replacen("nbd://", "nbds://", 1),
        certs.display()
    )
}

/// `nbds://127.0.0.1:PORT/VDI` of node `n`.
fn nbds_plain(n: &Node, vdi: &str) -> String {
    format!("{}/{vdi}", n.nbd_tcp.replacen("nbd://", "nbds://", 1))
}

fn port(n: &Node) -> &str {
    n.nbd_tcp.rsplit(':').next().unwrap()
}

/// `--image-opts` for QEMU's NBD driver over TCP with TLS credentials `tls0`.
fn qemu_opts(n: &Node, vdi: &str) -> String {
    format!(
        "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={},export={vdi},tls-creds=tls0",
        port(n)
    )
}

fn tls_object(dir: &Path) -> String {
    format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        dir.display()
    )
}

fn nbdinfo(uri: &str) -> Output {
    run(Command::new("nbdinfo").arg(uri))
}

fn client_dir(c: &Cluster) -> PathBuf {
    PathBuf::from(&c.tls.as_ref().expect("cluster.json has no tls").dir)
}

#[test]
fn test_tls_cluster_serves_nbds_to_qemu_and_nbdinfo() {
    if !require(CLIENTS) {
        return;
    }
    let c = tls_cluster();
    c.create_vdi("disk", "64M", &[]);
    let certs = client_dir(&c);
    for f in [
        "ca-cert.pem",
        "ca-key.pem",
        "client-cert.pem",
        "client-key.pem",
    ] {
        let mode = std::fs::metadata(certs.join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    for n in &c.nodes {
        assert!(n.tls_dir.is_some(), "node {} has no tls_dir", n.id);
    }

    // nbdinfo over TLS with the client certificate.
    let o = nbdinfo(&nbds(&c.nodes[0], "disk", &certs));
    let t = text(&o);
    assert!(o.status.success(), "nbdinfo nbds: {t}");
    assert!(t.contains("with TLS"), "{t}");
    assert!(t.contains("67108864"), "{t}");
    // `vdi info` gives the URI a client needs: nbds:// where TLS is required, and
    // nbdinfo attaches with it as it is.
    let o = c.drove(0, &["vdi", "info", "disk", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let uri = info["nbd_tcp"].as_str().unwrap().to_string();
    assert_eq!(uri, nbds_plain(&c.nodes[0], "disk"), "{info}");
    let o = nbdinfo(&format!("{uri}?tls-certificates={}", certs.display()));
    assert!(o.status.success(), "nbdinfo {uri}: {}", text(&o));

    // qemu-io writes through node 1, reads back through node 2, both over TLS.
    let obj = tls_object(&certs);
    let io = |n: &Node, cmd: &str| {
        let o = run(Command::new("qemu-io")
            .args(["--object", &obj, "--image-opts", "-c", cmd])
            .arg(qemu_opts(n, "disk")));
        let t = text(&o);
        assert!(o.status.success(), "qemu-io {cmd}: {t}");
        assert!(
            !t.contains("Pattern verification failed") && !t.contains("failed"),
            "qemu-io {cmd}: {t}"
        );
        t
    };
    io(&c.nodes[0], "write -P 0xa7 1M 256k");
    let t = io(&c.nodes[1], "read -P 0xa7 1M 256k");
    assert!(t.contains("read 262144/262144"), "{t}");

    // qemu-img info over TLS sees the size.
    let o = run(Command::new("qemu-img")
        .args(["info", "--object", &obj, "--image-opts"])
        .arg(qemu_opts(&c.nodes[0], "disk")));
    let t = text(&o);
    assert!(o.status.success(), "qemu-img info: {t}");
    assert!(t.contains("67108864"), "{t}");

    // The unix socket stays plaintext and serves the same data.
    let t = qemu_io(
        &c.nodes[1].uri("disk"),
        &["read -P 0xa7 1M 256k".to_string()],
    );
    assert!(t.contains("read 262144/262144"), "{t}");
    let o = nbdinfo(&c.nodes[0].uri("disk"));
    assert!(o.status.success(), "nbdinfo unix: {}", text(&o));
    assert!(text(&o).contains("without TLS"), "{}", text(&o));
}

#[test]
fn test_tls_cluster_refuses_plaintext_and_unauthenticated_clients() {
    if !require(CLIENTS) {
        return;
    }
    let c = tls_cluster();
    c.create_vdi("disk", "16M", &[]);
    let certs = client_dir(&c);
    let n = &c.nodes[0];
    let work = tempfile::tempdir().unwrap();

    // Plaintext on TCP: every option is answered "TLS required", so no export.
    let o = nbdinfo(&n.tcp_uri("disk"));
    assert!(
        !o.status.success(),
        "plaintext nbdinfo got in: {}",
        text(&o)
    );
    let o = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read 0 4k"])
        .arg(n.tcp_uri("disk")));
    assert!(
        !o.status.success(),
        "plaintext qemu-io got in: {}",
        text(&o)
    );
    assert!(text(&o).contains("TLS"), "{}", text(&o));

    // TLS that trusts the node but has no client certificate.
    let nocert = work.path().join("nocert");
    std::fs::create_dir(&nocert).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), nocert.join("ca-cert.pem")).unwrap();
    let o = nbdinfo(&nbds(n, "disk", &nocert));
    assert!(
        !o.status.success(),
        "no client certificate got in: {}",
        text(&o)
    );

    // A client certificate of another CA (trusting our node, to get that far).
    let other = work.path().join("other-ca");
    let stranger = work.path().join("stranger");
    let o = run(Command::new(drove_bin())
        .args(["cert", "ca", "--out"])
        .arg(&other));
    assert!(o.status.success(), "{}", text(&o));
    let o = run(Command::new(drove_bin())
        .args(["cert", "client", "--name", "mallory", "--ca"])
        .arg(&other)
        .arg("--out")
        .arg(&stranger));
    assert!(o.status.success(), "{}", text(&o));
    std::fs::remove_file(stranger.join("ca-cert.pem")).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), stranger.join("ca-cert.pem")).unwrap();
    let o = nbdinfo(&nbds(n, "disk", &stranger));
    assert!(
        !o.status.success(),
        "foreign client certificate got in: {}",
        text(&o)
    );
    let obj = tls_object(&stranger);
    let o = run(Command::new("qemu-img")
        .args(["info", "--object", &obj, "--image-opts"])
        .arg(qemu_opts(n, "disk")));
    assert!(
        !o.status.success(),
        "foreign certificate, qemu-img: {}",
        text(&o)
    );

    // The refusals are the node's: it logged them, and still serves good clients.
    let log = std::fs::read_to_string(Path::new(&n.data).join("node.log")).unwrap();
    assert!(log.contains("peer sent no certificates"), "{log}");
    let o = nbdinfo(&nbds(n, "disk", &certs));
    assert!(o.status.success(), "after refusals: {}", text(&o));
    let o = nbdinfo(&n.uri("disk"));
    assert!(o.status.success(), "unix socket: {}", text(&o));
}

/// Run `cmd` until it exits (at most 30 s: a node that starts is killed and fails).
fn exits(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("{cmd:?} kept running: it should have refused to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn cert(args: &[&str], dirs: &[(&str, &Path)]) -> serde_json::Value {
    let mut cmd = Command::new(drove_bin());
    cmd.arg("cert").args(args).arg("--json");
    for (flag, d) in dirs {
        cmd.arg(flag).arg(d);
    }
    let o = run(&mut cmd);
    assert!(o.status.success(), "drove cert {args:?}: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn test_cert_commands_make_a_node_that_requires_tls() {
    if !require(CLIENTS) {
        return;
    }
    let w = tempfile::tempdir().unwrap();
    let (ca, node, client) = (w.path().join("ca"), w.path().join("n1"), w.path().join("c"));
    let v = cert(&["ca"], &[("--out", &ca)]);
    assert_eq!(v["kind"], "ca");
    // A second CA over the first is refused; the key stays.
    let key = std::fs::read(ca.join("ca-key.pem")).unwrap();
    let o = run(Command::new(drove_bin())
        .args(["cert", "ca", "--out"])
        .arg(&ca));
    assert!(
        !o.status.success() && text(&o).contains("already exists"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(ca.join("ca-key.pem")).unwrap(), key);
    let v = cert(
        &["node", "--name", "n1", "--host", "127.0.0.1", "localhost"],
        &[("--ca", &ca), ("--out", &node)],
    );
    assert_eq!(v["hosts"], serde_json::json!(["127.0.0.1", "localhost"]));
    let v = cert(
        &["client", "--name", "vm-1"],
        &[("--ca", &ca), ("--out", &client)],
    );
    assert_eq!(v["files"].as_array().unwrap().len(), 3);
    for f in v["files"].as_array().unwrap() {
        let mode = std::fs::metadata(f.as_str().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }

    // Bad TLS directories stop the node at start-up, naming the file.
    let data = w.path().join("data");
    let node_run = |extra: &[&str], tls: Option<&Path>| {
        let mut cmd = Command::new(drove_bin());
        cmd.args(["node", "run", "--data"]).arg(&data);
        cmd.args(["--listen", "127.0.0.1:0"]).args(extra);
        if let Some(t) = tls {
            cmd.arg("--tls-dir").arg(t);
        }
        exits(&mut cmd)
    };
    let o = node_run(&[], Some(&w.path().join("missing")));
    assert!(!o.status.success());
    assert!(
        text(&o).contains("Bad TLS directory") && text(&o).contains("ca-cert.pem"),
        "{}",
        text(&o)
    );
    std::fs::set_permissions(
        node.join("server-key.pem"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let o = node_run(&[], Some(&node));
    assert!(!o.status.success());
    assert!(text(&o).contains("chmod 600"), "{}", text(&o));
    std::fs::set_permissions(
        node.join("server-key.pem"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let o = node_run(&["--nbd-tls", "require"], None);
    assert!(!o.status.success());
    assert!(text(&o).contains("needs --tls-dir"), "{}", text(&o));

    // A node started by hand with those files: TLS required by default.
    let (admin, nbd) = (free_port(), free_port());
    let log = std::fs::File::create(w.path().join("node.log")).unwrap();
    let mut child = Command::new(drove_bin())
        .args(["node", "run", "--data"])
        .arg(&data)
        .args(["--listen", &format!("127.0.0.1:{admin}")])
        .args(["--peer-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--nbd-listen", &format!("127.0.0.1:{nbd}")])
        .arg("--tls-dir")
        .arg(&node)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let cluster = format!("127.0.0.1:{admin}");
    wait_until(
        Duration::from_secs(60),
        "hand-started node to serve",
        || {
            Command::new(drove_bin())
                .args(["vdi", "create", "disk", "8M", "--copies", "1"])
                .args(["--cluster", &cluster])
                // Its admin API speaks HTTPS only; the node's directory has the CA.
                .env("DROVE_CA", &node)
                .output()
                .is_ok_and(|o| o.status.success())
        },
    );
    let uri = format!(
        "nbds://127.0.0.1:{nbd}/disk?tls-certificates={}",
        client.display()
    );
    let o = nbdinfo(&uri);
    let plain = nbdinfo(&format!("nbd://127.0.0.1:{nbd}/disk"));
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(w.path().join("node.log")).unwrap_or_default();
    assert!(
        o.status.success(),
        "nbdinfo with a `drove cert client` directory: {}\n{log}",
        text(&o)
    );
    assert!(text(&o).contains("with TLS"), "{}", text(&o));
    assert!(
        !plain.status.success(),
        "plaintext got in: {}",
        text(&plain)
    );
}

/// curl with a 10 s limit: its output, stderr included, and whether it succeeded.
fn curl(args: &[&str]) -> (bool, String) {
    let o = run(Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args));
    (o.status.success(), text(&o))
}

/// In a `drove up --tls` cluster the peer port (objects, Raft, internal metadata
/// calls) speaks mutual TLS: replication and elections go through it, another
/// node's certificate gets in, and nothing else does: no certificate, the cluster's
/// own client certificate (a hypervisor's, not a node's), plaintext. A node with a
/// certificate of another CA cannot join.
#[test]
fn test_the_peer_port_lets_in_only_the_clusters_nodes() {
    if !require(&["curl", "qemu-io"]) {
        return;
    }
    let mut c = Cluster::start_with(tempfile::tempdir().unwrap(), 3, 3, &["--tls"]);
    // Three copies on three nodes: every write crosses two peer ports.
    c.create_vdi("p", "8M", &["--copies", "3"]);
    qemu_io(
        &c.nodes[0].uri("p"),
        &["write -P 0x5a 0 1M".into(), "flush".into()],
    );
    qemu_io(&c.nodes[2].uri("p"), &["read -P 0x5a 0 1M".into()]);

    let target = &c.nodes[0];
    let hello = format!("https://{}/meta/hello", target.peer);
    let peer_tls = PathBuf::from(c.nodes[1].tls_dir.as_ref().unwrap());
    let ca = peer_tls.join("ca-cert.pem");
    let ca = ca.to_str().unwrap();
    let file = |d: &Path, f: &str| d.join(f).to_str().unwrap().to_string();
    let (ok, out) = curl(&[
        "--cacert",
        ca,
        "--cert",
        &file(&peer_tls, "server-cert.pem"),
        "--key",
        &file(&peer_tls, "server-key.pem"),
        &hello,
    ]);
    assert!(
        ok && out.contains("\"cluster\""),
        "a node's certificate: {out}"
    );
    let client = client_dir(&c);
    let (ok, out) = curl(&[
        "--cacert",
        ca,
        "--cert",
        &file(&client, "client-cert.pem"),
        "--key",
        &file(&client, "client-key.pem"),
        &hello,
    ]);
    assert!(!ok, "a client certificate got onto the peer port: {out}");
    let (ok, out) = curl(&["--cacert", ca, &hello]);
    assert!(!ok, "no certificate got onto the peer port: {out}");
    let (ok, out) = curl(&[&format!("http://{}/meta/hello", target.peer)]);
    assert!(!ok, "plaintext got an answer on the peer port: {out}");

    // A node of another CA, joining through the admin API: the cluster's peer
    // ports refuse its certificate, and it gives up.
    let w = tempfile::tempdir().unwrap();
    let (other_ca, other) = (w.path().join("ca"), w.path().join("node"));
    cert(&["ca"], &[("--out", &other_ca)]);
    cert(
        &["node", "--name", "intruder", "--host", "127.0.0.1"],
        &[("--ca", &other_ca), ("--out", &other)],
    );
    let o = exits(
        Command::new(drove_bin())
            .args(["node", "run", "--data"])
            .arg(w.path().join("data"))
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--peer-listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--nbd-listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--join", &target.admin, "--join-timeout", "5"])
            .arg("--tls-dir")
            .arg(&other),
    );
    assert!(!o.status.success(), "the intruder joined: {}", text(&o));
    // Refused on the admin API's HTTPS (it trusts only its own CA; so does the
    // cluster), or later on the peer port.
    assert!(
        text(&o).contains("cluster id") || text(&o).contains("node id"),
        "{}",
        text(&o)
    );
    assert_eq!(c.status()["map"]["nodes"].as_object().unwrap().len(), 3);
    let log = std::fs::read_to_string(Path::new(&target.data).join("node.log")).unwrap();
    assert!(log.contains("TLS handshake failed"), "{log}");
    // The cluster still works, through its peer ports, after a restart of a node.
    c.restart(1);
    qemu_io(&c.nodes[1].uri("p"), &["read -P 0x5a 0 1M".into()]);
}

/// qemu-io on VDI `vdi` of node `n` (its unix socket) through QEMU's LUKS layer
/// with passphrase `pass`.
fn luks_io(n: &Node, vdi: &str, pass: &str, cmds: &[&str]) -> Output {
    let mut c = Command::new("qemu-io");
    c.args(["--object", &format!("secret,id=sec0,data={pass}")])
        .arg("--image-opts");
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(format!(
        "driver=luks,key-secret=sec0,file.driver=nbd,file.server.type=unix,file.server.path={},file.export={vdi}",
        n.nbd_unix
    ));
    run(&mut c)
}

/// At-rest encryption on top of drove, as docs/security.md shows it: QEMU's LUKS
/// format made on a VDI with qemu-img and written with qemu-io through a node's
/// socket. The data reads back through LUKS; the VDI's own bytes (what every replica
/// stores) hold the LUKS header and none of the plaintext; a wrong passphrase opens
/// nothing.
#[test]
fn test_luks_on_a_drove_disk_keeps_the_plaintext_off_the_replicas() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    c.create_vdi("secret", "64M", &["--copies", "3"]);
    let uri = c.nodes[0].uri("secret");
    // QEMU times its key derivation with the thread's CPU time first, and on this
    // kernel that measure often comes back 0 ("Unable to get accurate CPU usage",
    // 5 of 10 tries with a local file): that error, and only it, is tried again.
    let mut tries = 0;
    let o = loop {
        tries += 1;
        let o = run(Command::new("qemu-img").args([
            "create",
            "-q",
            "-f",
            "luks",
            "--object",
            "secret,id=sec0,data=correct-horse",
            "-o",
            "key-secret=sec0,iter-time=10",
            &uri,
            "32M",
        ]));
        if o.status.success()
            || !text(&o).contains("Unable to get accurate CPU usage")
            || tries == 30
        {
            break o;
        }
    };
    assert!(
        o.status.success(),
        "qemu-img create -f luks ({tries} tries): {}",
        text(&o)
    );

    let o = luks_io(
        &c.nodes[0],
        "secret",
        "correct-horse",
        &["write -P 0x5a 0 4M", "read -P 0x5a 0 4M"],
    );
    assert!(o.status.success(), "qemu-io through LUKS: {}", text(&o));
    assert!(!text(&o).contains("verification failed"), "{}", text(&o));
    // Through another node, after the first client let go.
    let o = luks_io(
        &c.nodes[2],
        "secret",
        "correct-horse",
        &["read -P 0x5a 0 4M"],
    );
    assert!(o.status.success(), "read back through LUKS: {}", text(&o));
    assert!(!text(&o).contains("verification failed"), "{}", text(&o));

    let tmp = tempfile::tempdir().unwrap();
    let raw = read_image(&c.nodes[1].uri("secret"), tmp.path(), 64 << 20);
    assert_eq!(
        &raw[..6],
        b"LUKS\xba\xbe",
        "no LUKS header at the start of the VDI"
    );
    let plain = [0x5au8; 4096];
    assert!(
        !raw.chunks(4096).any(|b| b == plain),
        "a 4 KiB block of plaintext is stored in the VDI"
    );

    let o = luks_io(&c.nodes[0], "secret", "wrong-horse", &["read 0 4k"]);
    assert!(
        !o.status.success(),
        "a wrong passphrase opened it: {}",
        text(&o)
    );
}

/// A VM boots from a drove disk over NBD with TLS on TCP (QEMU's tls-creds-x509 with
/// the cluster's client certificate, TCG): it makes a filesystem and writes a file,
/// and the host reads that file back through another node's unix socket.
#[test]
fn test_a_vm_boots_from_a_drove_disk_over_nbd_tls() {
    let Some(kit) = require_ok(common::vm::VmKit::find()) else {
        return;
    };
    if !require(&["qemu-img", "debugfs"]) {
        return;
    }
    let c = tls_cluster();
    c.create_vdi("vmdisk", "64M", &[]);
    let certs = client_dir(&c);
    let tmp = tempfile::tempdir().unwrap();
    let initrd = kit.initramfs(
        &tmp.path().join("w"),
        "mke2fs -q /dev/vda && mount /dev/vda /mnt && \
         echo hello-over-tls > /mnt/hello.txt && umount /mnt && echo DROVE-TLS-DONE",
    );
    let drive = format!(
        "driver=raw,file.driver=nbd,file.server.type=inet,file.server.host=127.0.0.1,\
         file.server.port={},file.export=vmdisk,file.tls-creds=tls0,if=virtio,cache=none",
        port(&c.nodes[0])
    );
    let extra = ["-object".to_string(), tls_object(&certs)];
    let out = kit.boot_drive(&initrd, &drive, &extra, Duration::from_secs(300));
    assert!(
        out.contains("DROVE-TLS-DONE"),
        "boot over NBD with TLS failed:\n{out}"
    );

    // The host reads the file through node 2's unix socket.
    let raw = tmp.path().join("disk.raw");
    let o = run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(c.nodes[1].uri("vmdisk"))
        .arg(&raw));
    assert!(o.status.success(), "{}", text(&o));
    let o = run(Command::new("debugfs")
        .args(["-R", "cat /hello.txt"])
        .arg(&raw));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("hello-over-tls"),
        "{}",
        text(&o)
    );
}

/// `nbdinfo --list` over TLS from node `n` with the certificates in `dir`.
fn list_exports(n: &Node, dir: &Path) -> Output {
    let uri = format!(
        "{}/?tls-certificates={}",
        n.nbd_tcp.replacen("nbd://", "nbds://", 1),
        dir.display()
    );
    run(Command::new("nbdinfo").arg("--list").arg(uri))
}

/// A VDI's access list (`drove vdi access`): over TCP only the named client
/// certificates attach it or see it in LIST; another certificate of the same CA is
/// told it does not exist (and the node logs why); the unix socket is not
/// concerned; a snapshot carries the list; `--anyone` opens it again.
#[test]
fn test_a_vdi_access_list_admits_only_the_named_certificates() {
    if !require(CLIENTS) {
        return;
    }
    let c = tls_cluster();
    c.create_vdi("secret", "16M", &[]);
    c.create_vdi("public", "16M", &[]);
    let ours = client_dir(&c);
    let work = tempfile::tempdir().unwrap();
    let bob = work.path().join("bob");
    let o = run(Command::new(drove_bin())
        .args(["cert", "client", "--name", "bob", "--ca"])
        .arg(&ours)
        .arg("--out")
        .arg(&bob));
    assert!(o.status.success(), "{}", text(&o));

    // The cluster's own client certificate is named drove-client.
    let o = c.drove(
        0,
        &["vdi", "access", "secret", "--allow", "drove-client,backup"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("drove-client, backup"), "{}", text(&o));
    let bads: [&[&str]; 3] = [
        &["--allow", "a\tb"],
        &["--allow", "a,a"],
        &["--allow", "x", "--anyone"],
    ];
    for bad in bads {
        let mut args = vec!["vdi", "access", "secret"];
        args.extend_from_slice(bad);
        let o = c.drove(0, &args);
        assert!(!o.status.success(), "{bad:?} accepted: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{}", text(&o));
    }
    // Read through node 2 (a consistent read): from then on node 2 has the list.
    let o = c.drove(1, &["vdi", "info", "secret", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["nbd_clients"],
        serde_json::json!(["drove-client", "backup"])
    );
    let n = &c.nodes[1];

    // Named: attaches and lists it.
    let o = nbdinfo(&nbds(n, "secret", &ours));
    assert!(o.status.success(), "named client refused: {}", text(&o));
    let o = list_exports(n, &ours);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("secret") && text(&o).contains("public"),
        "{}",
        text(&o)
    );
    // Another certificate of the same CA: not in LIST, not attached, with the
    // answer a missing VDI gets; the other VDI is still its to use.
    let o = list_exports(n, &bob);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !text(&o).contains("secret"),
        "LIST named it to bob: {}",
        text(&o)
    );
    assert!(text(&o).contains("public"), "{}", text(&o));
    let refused = nbdinfo(&nbds(n, "secret", &bob));
    assert!(!refused.status.success(), "bob got in: {}", text(&refused));
    let missing = nbdinfo(&nbds(n, "nothing-here", &bob));
    assert!(!missing.status.success());
    let obj = tls_object(&bob);
    let o = run(Command::new("qemu-img")
        .args(["info", "--object", &obj, "--image-opts"])
        .arg(qemu_opts(n, "secret")));
    assert!(!o.status.success(), "bob's qemu-img got in: {}", text(&o));
    let o = nbdinfo(&nbds(n, "public", &bob));
    assert!(
        o.status.success(),
        "bob refused a VDI without a list: {}",
        text(&o)
    );
    let log = std::fs::read_to_string(Path::new(&n.data).join("node.log")).unwrap();
    assert!(
        log.contains("not on the VDI's access list") && log.contains("certificate bob"),
        "the refusal is not logged:\n{log}"
    );
    // The unix socket: file permissions decide.
    let o = nbdinfo(&n.uri("secret"));
    assert!(o.status.success(), "unix socket: {}", text(&o));

    // A snapshot is an export with the same list.
    let o = c.drove(0, &["vdi", "snapshot", "secret", "secret-snap"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(1, &["vdi", "access", "secret-snap", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["nbd_clients"],
        serde_json::json!(["drove-client", "backup"])
    );
    assert!(!nbdinfo(&nbds(n, "secret-snap", &bob)).status.success());

    // Open to anyone again.
    let o = c.drove(0, &["vdi", "access", "secret", "--anyone"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(1, &["vdi", "info", "secret"]);
    assert!(
        text(&o).contains("any client the NBD TCP port lets in"),
        "{}",
        text(&o)
    );
    let o = nbdinfo(&nbds(n, "secret", &bob));
    assert!(
        o.status.success(),
        "--anyone still refuses bob: {}",
        text(&o)
    );
}

/// The base64 of the first certificate in PEM `text` (white space dropped).
fn pem_body(text: &str) -> String {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    let start = text
        .find(BEGIN)
        .unwrap_or_else(|| panic!("no certificate in: {text}"));
    let rest = &text[start + BEGIN.len()..];
    let end = rest
        .find("-----END CERTIFICATE-----")
        .unwrap_or_else(|| panic!("no certificate end in: {text}"));
    rest[..end].split_whitespace().collect()
}

/// The certificate the peer port at `peer` presents now, as `openssl s_client`
/// sees it, logging in with the node certificate in `as_node`.
fn served_cert(peer: &str, as_node: &Path) -> String {
    let o = run(Command::new("openssl")
        .args(["s_client", "-connect", peer, "-CAfile"])
        .arg(as_node.join("ca-cert.pem"))
        .arg("-cert")
        .arg(as_node.join("server-cert.pem"))
        .arg("-key")
        .arg(as_node.join("server-key.pem")));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    if out.contains("-----BEGIN CERTIFICATE-----") {
        pem_body(&out)
    } else {
        String::new()
    }
}

/// Rotation without downtime: a node's certificate and key are replaced by a new
/// pair of the same CA while a QEMU client has the node's disk open over NBD+TLS
/// and its writes replicate over the peer port. The next handshakes present the
/// new certificate (checked with openssl on the peer port, and with nbdinfo on
/// the NBD port), the open client goes on writing and reading over its
/// connection without an error, and after the other node restarts (new peer
/// connections, both ways, with the new certificate) the data reads back there.
#[test]
fn test_a_node_certificate_replaced_while_a_client_writes_is_used_without_a_break() {
    if !require(&["qemu-io", "nbdinfo", "openssl"]) {
        return;
    }
    let mut c = tls_cluster();
    c.create_vdi("r", "16M", &["--copies", "2"]);
    let certs = client_dir(&c);
    let n = c.nodes[0].clone();
    let n_tls = PathBuf::from(n.tls_dir.as_ref().unwrap());
    let other_tls = PathBuf::from(c.nodes[1].tls_dir.as_ref().unwrap());
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let old = pem_body(&read(&n_tls.join("server-cert.pem")));
    assert_eq!(served_cert(&n.peer, &other_tls), old);

    // A VM's disk, open over one NBD+TLS connection through node 1.
    let obj = tls_object(&certs);
    let mut vm = Command::new("qemu-io")
        .args(["--object", &obj, "--image-opts"])
        .arg(qemu_opts(&n, "r"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = vm.stdin.take().unwrap();
    use std::io::Write as _;
    writeln!(input, "write -P 0x31 0 1M").unwrap();
    let mut attached = String::new();
    wait_until(Duration::from_secs(30), "qemu-io attached over TLS", || {
        let o = c.drove(0, &["vdi", "status", "r", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let found = v["clients"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|cl| {
                cl["client"]
                    .as_str()
                    .filter(|s| s.contains("certificate drove-client"))
                    .map(str::to_string)
            });
        match found {
            Some(s) => {
                attached = s;
                true
            }
            None => false,
        }
    });

    // Rotate: a new pair of the same CA put in place of the old one.
    let w = tempfile::tempdir().unwrap();
    let fresh = w.path().join("fresh");
    cert(
        &[
            "node",
            "--name",
            "node1-rotated",
            "--host",
            "127.0.0.1",
            "--host",
            "localhost",
        ],
        &[("--ca", &certs), ("--out", &fresh)],
    );
    let new = pem_body(&read(&fresh.join("server-cert.pem")));
    assert_ne!(new, old);
    for f in ["server-key.pem", "server-cert.pem"] {
        std::fs::rename(fresh.join(f), n_tls.join(f)).unwrap();
    }
    // The next handshakes present it (the files are looked at once a second).
    wait_until(
        Duration::from_secs(30),
        "the peer port presenting the new certificate",
        || served_cert(&n.peer, &other_tls) == new,
    );
    let o = nbdinfo(&nbds(&n, "r", &certs));
    assert!(
        o.status.success(),
        "nbdinfo after the rotation: {}",
        text(&o)
    );
    let log = read(&Path::new(&n.data).join("node.log"));
    assert!(log.contains("TLS certificate reloaded"), "{log}");

    // The open client is still the same connection, and goes on.
    let o = c.drove(0, &["vdi", "status", "r", "--json"]);
    assert!(
        text(&o).contains(&attached),
        "the client attached before the rotation ({attached}) is gone: {}",
        text(&o)
    );
    for cmd in [
        "write -P 0x32 1M 1M",
        "read -P 0x31 0 1M",
        "read -P 0x32 1M 1M",
        "flush",
    ] {
        writeln!(input, "{cmd}").unwrap();
    }
    drop(input);
    let end = Instant::now() + Duration::from_secs(60);
    while vm.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = vm.kill();
            panic!("qemu-io did not finish after its input ended");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = vm.wait_with_output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "qemu-io: {t}");
    for line in [
        "wrote 1048576/1048576 bytes at offset 0",
        "wrote 1048576/1048576 bytes at offset 1048576",
        "read 1048576/1048576 bytes at offset 0",
        "read 1048576/1048576 bytes at offset 1048576",
    ] {
        assert!(t.contains(line), "qemu-io did not say '{line}': {t}");
    }
    assert!(
        !t.contains("Pattern verification failed") && !t.to_lowercase().contains("error"),
        "{t}"
    );

    // New peer connections both ways, with the new certificate on node 1's side.
    c.restart(1);
    qemu_io(
        &c.nodes[1].uri("r"),
        &["read -P 0x32 1M 1M".into(), "read -P 0x31 0 1M".into()],
    );
    assert_eq!(served_cert(&c.nodes[0].peer, &other_tls), new);
}

/// With certificates the admin API speaks HTTPS only. The CLI without the CA is
/// told what to set (so is plain HTTP from curl); with the CA file, or `drove up
/// --tls`'s directory (CA and client certificate), it works; `https://` without a
/// CA is refused before anything is sent; a CA of another cluster does not trust
/// the node; curl with the CA reads /api/status; and the nodes ask each other's
/// admin APIs over HTTPS (`cluster health` hears from every node).
#[test]
fn test_the_admin_api_speaks_only_https_with_certificates() {
    if !require(&["curl"]) {
        return;
    }
    let c = tls_cluster();
    let admin = c.nodes[0].admin.clone();
    let ca_dir = client_dir(&c);
    let ca_file = ca_dir.join("ca-cert.pem");
    let cli = |args: &[&str], cluster: &str, ca: Option<&Path>| {
        let mut cmd = Command::new(drove_bin());
        cmd.args(args)
            .args(["--cluster", cluster])
            .env_remove("DROVE_CA");
        if let Some(ca) = ca {
            cmd.arg("--ca").arg(ca);
        }
        run(&mut cmd)
    };
    let o = cli(&["vdi", "list"], &admin, None);
    assert!(!o.status.success(), "plain HTTP got in: {}", text(&o));
    assert!(
        text(&o).contains("HTTPS only") && text(&o).contains("DROVE_CA"),
        "{}",
        text(&o)
    );
    let o = cli(&["vdi", "create", "h", "8M"], &admin, Some(&ca_file));
    assert!(o.status.success(), "with the CA file: {}", text(&o));
    let o = cli(&["vdi", "info", "h", "--json"], &admin, Some(&ca_dir));
    assert!(o.status.success(), "with the CA directory: {}", text(&o));
    let https = format!("https://{admin}");
    let o = cli(&["vdi", "info", "h"], &https, None);
    assert!(
        !o.status.success() && text(&o).contains("asks for https"),
        "{}",
        text(&o)
    );
    let o = cli(&["vdi", "info", "h"], &https, Some(&ca_file));
    assert!(o.status.success(), "https:// with the CA: {}", text(&o));

    // A CA of another cluster: the node's certificate is not trusted.
    let w = tempfile::tempdir().unwrap();
    let other = w.path().join("other");
    cert(&["ca"], &[("--out", &other)]);
    let o = cli(&["vdi", "list"], &admin, Some(&other.join("ca-cert.pem")));
    assert!(
        !o.status.success(),
        "another CA trusted the node: {}",
        text(&o)
    );
    assert!(text(&o).contains("over HTTPS"), "{}", text(&o));

    // Any HTTP client: plain HTTP is answered with the way in; HTTPS with the CA
    // works (the node certificates of `drove up --tls` name 127.0.0.1).
    let (_, out) = curl(&["-i", &format!("http://{admin}/api/status")]);
    assert!(out.contains(" 400 ") && out.contains("HTTPS only"), "{out}");
    let (ok, out) = curl(&[
        "--cacert",
        ca_file.to_str().unwrap(),
        &format!("https://{admin}/api/status"),
    ]);
    assert!(ok && out.contains("\"leader\""), "{out}");

    // Node 1 asks node 2's admin API for its health, over HTTPS.
    let o = c.drove(0, &["cluster", "health", "--json"]);
    assert!(
        !text(&o).contains("did not describe itself"),
        "{}",
        text(&o)
    );
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(h["checks"].is_array(), "{h}");
    // The refusals are logged by the node.
    let log = std::fs::read_to_string(Path::new(&c.nodes[0].data).join("node.log")).unwrap();
    assert!(log.contains("plain HTTP on the HTTPS port"), "{log}");
}

/// Over HTTPS a client certificate can stand for a token: without a token, the
/// cluster's client certificate (CN drove-client) has no role until a token of its
/// name gives it one (read-only here: it lists but cannot create), and a node's
/// certificate is an admin.
#[test]
fn test_a_client_certificate_has_the_role_of_the_token_of_its_name() {
    if !require(&["curl"]) {
        return;
    }
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 2, 2, &["--tls", "--auth"]);
    let admin = c.nodes[0].admin.clone();
    // `drove ARGS` with the CA (and the certificates) in `dir`, and no token.
    let as_cert = |dir: &Path, args: &[&str]| {
        run(Command::new(drove_bin())
            .args(args)
            .args(["--cluster", &admin])
            .env_remove("DROVE_TOKEN")
            .env_remove("DROVE_TOKEN_FILE")
            .env("DROVE_CA", dir))
    };
    let client = client_dir(&c);
    let o = as_cert(&client, &["vdi", "list"]);
    assert!(!o.status.success(), "no role, yet listed: {}", text(&o));
    assert!(
        text(&o).contains("certificate 'drove-client' has no role"),
        "{}",
        text(&o)
    );
    let o = c.drove(
        0,
        &["token", "create", "drove-client", "--role", "read-only"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = as_cert(&client, &["vdi", "list"]);
    assert!(o.status.success(), "read-only certificate: {}", text(&o));
    let o = as_cert(&client, &["vdi", "create", "nope", "8M"]);
    assert!(
        !o.status.success(),
        "a read-only certificate created: {}",
        text(&o)
    );
    assert!(
        text(&o).contains("certificate 'drove-client' has the role read-only"),
        "{}",
        text(&o)
    );

    // A node's certificate, presented as a client's: an admin.
    let node_tls = PathBuf::from(c.nodes[1].tls_dir.as_ref().unwrap());
    let w = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("ca-cert.pem", "ca-cert.pem"),
        ("server-cert.pem", "client-cert.pem"),
        ("server-key.pem", "client-key.pem"),
    ] {
        std::fs::copy(node_tls.join(from), w.path().join(to)).unwrap();
    }
    let o = as_cert(w.path(), &["vdi", "create", "by-node", "8M"]);
    assert!(o.status.success(), "node certificate: {}", text(&o));
    // Without any certificate or token: refused.
    let o = as_cert(&client.join("ca-cert.pem"), &["vdi", "list"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("requires an admin API token"),
        "{}",
        text(&o)
    );
}

/// `drove up` without options makes a cluster with certificates and an admin
/// token, and prints what the CLI needs; with that the CLI works, without the token
/// it is refused, and a restart with `--no-tls` is refused (a restart keeps what
/// the cluster had).
#[test]
fn test_drove_up_makes_certificates_and_a_token_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let down = DownOnDrop(dir.path().to_path_buf());
    let up = |extra: &[&str]| {
        run(Command::new(drove_bin())
            .args([
                "up",
                "--nodes",
                "1",
                "--detach",
                "--base-port",
                "0",
                "--dir",
            ])
            .arg(&down.0)
            .args(extra)
            .env_remove("DROVE_CA")
            .env_remove("DROVE_TOKEN_FILE")
            .env_remove("DROVE_TOKEN"))
    };
    let o = up(&[]);
    assert!(o.status.success(), "{}", text(&o));
    let printed = String::from_utf8_lossy(&o.stdout).into_owned();
    let export = |var: &str| {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {var}=")))
            .unwrap_or_else(|| panic!("drove up printed no {var}: {printed}"))
            .to_string()
    };
    let (cluster, ca, token) = (
        export("DROVE_CLUSTER"),
        export("DROVE_CA"),
        export("DROVE_TOKEN_FILE"),
    );
    assert!(Path::new(&ca).join("ca-cert.pem").is_file(), "{ca}");
    let mode = std::fs::metadata(&token).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{token}");
    let cli = |args: &[&str], with_token: bool| {
        let mut cmd = Command::new(drove_bin());
        cmd.args(args)
            .env("DROVE_CLUSTER", &cluster)
            .env("DROVE_CA", &ca)
            .env_remove("DROVE_TOKEN");
        if with_token {
            cmd.env("DROVE_TOKEN_FILE", &token);
        } else {
            cmd.env_remove("DROVE_TOKEN_FILE");
        }
        run(&mut cmd)
    };
    let o = cli(&["vdi", "create", "d", "8M"], true);
    assert!(o.status.success(), "{}", text(&o));
    // DROVE_CA=DIR/tls also presents the cluster's client certificate, which has no
    // role until a token of its name gives it one.
    let o = cli(&["vdi", "list"], false);
    assert!(!o.status.success(), "listed without a token: {}", text(&o));
    assert!(
        text(&o).contains("'drove-client' has no role") && text(&o).contains("send a token"),
        "{}",
        text(&o)
    );

    let o = run(Command::new(drove_bin())
        .args(["down", "--dir"])
        .arg(&down.0));
    assert!(o.status.success(), "{}", text(&o));
    let o = up(&["--no-tls"]);
    assert!(!o.status.success(), "restarted without TLS: {}", text(&o));
    assert!(text(&o).contains("--no-tls"), "{}", text(&o));
    let o = up(&[]);
    assert!(o.status.success(), "restart: {}", text(&o));
    let o = cli(&["vdi", "info", "d"], true);
    assert!(o.status.success(), "after the restart: {}", text(&o));
}

/// A client certificate named like an address (`alice@example.com`: `drove cert
/// client` takes `@`, as certificates of people usually are) gets a role from the
/// token of its name; token names once refused `@`, so it never could.
#[test]
fn test_a_certificate_named_with_an_at_sign_gets_the_role_of_its_token() {
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 1, 1, &["--tls", "--auth"]);
    let work = tempfile::tempdir().unwrap();
    let alice = work.path().join("alice");
    let o = run(Command::new(drove_bin())
        .args(["cert", "client", "--name", "alice@example.com", "--ca"])
        .arg(client_dir(&c))
        .arg("--out")
        .arg(&alice));
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(
        0,
        &[
            "token",
            "create",
            "alice@example.com",
            "--role",
            "read-only",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = run(Command::new(drove_bin())
        .args(["vdi", "list", "--cluster", &c.nodes[0].admin])
        .env_remove("DROVE_TOKEN")
        .env_remove("DROVE_TOKEN_FILE")
        .env("DROVE_CA", &alice));
    assert!(o.status.success(), "alice's certificate: {}", text(&o));
    let o = c.drove(0, &["token", "delete", "alice@example.com"]);
    assert!(o.status.success(), "{}", text(&o));
}
