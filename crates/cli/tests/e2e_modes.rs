//! File modes of a node's data directory: VDI data, metadata, logs and keys are the
//! node's user's only whatever the umask, and the NBD unix socket is reachable by
//! its group only. Under umask 000 every object, `raft.redb` and `nbd.sock` itself
//! were once open to every local user (a user could attach and write any VDI).
mod common;
use common::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// uid and gid of a user that is neither the node's nor in its group.
const NOBODY: u32 = 65534;

/// Every entry under `dir` (not `dir` itself), symbolic links not followed.
fn walk(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        let is_dir = m.is_dir();
        out.push((p.clone(), m));
        if is_dir {
            out.extend(walk(&p));
        }
    }
    out
}

fn mode(m: &std::fs::Metadata) -> u32 {
    m.permissions().mode() & 0o7777
}

/// Start `drove up` (TLS and tokens on) with the nodes under umask 000.
fn start_under_umask_000(nodes: usize) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    // Reachable by other users, so that the test can try as one.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Cluster::start_cmd(dir, nodes, nodes, &["--tls", "--auth"], |cmd| {
        // SAFETY: umask is async-signal-safe and changes only the child's mask.
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::umask(rustix::fs::Mode::empty());
                Ok(())
            });
        }
    })
}

#[test]
fn test_a_node_under_umask_000_keeps_its_data_dir_private() {
    if !require(&["qemu-io"]) {
        return;
    }
    let c = start_under_umask_000(3);
    c.create_vdi("m1", "16M", &[]);
    // Objects on every node (3 copies), through node 1's socket.
    let uri = c.nodes[0].uri("m1");
    let out = qemu_io(&uri, &["write -P 0x5a 0 8M".to_string()]);
    assert!(!out.contains("failed"), "{out}");
    let o = c.drove(0, &["vdi", "snapshot", "m1", "m1-snap"]);
    assert!(o.status.success(), "{}", text(&o));
    let gid = rustix::process::getegid().as_raw();

    for n in &c.nodes {
        let data = Path::new(&n.data);
        let top = std::fs::metadata(data).unwrap();
        assert_eq!(mode(&top), 0o710, "{}: {:o}", n.data, mode(&top));
        assert_eq!(top.gid(), gid, "{}: the socket's group", n.data);
        let mut seen = std::collections::BTreeSet::new();
        let mut objects = 0;
        for (p, m) in walk(data) {
            let name = p.strip_prefix(data).unwrap().display().to_string();
            if m.file_type().is_socket() {
                assert_eq!(name, "nbd.sock");
                assert_eq!(mode(&m), 0o660, "{name}: {:o}", mode(&m));
                assert_eq!(m.gid(), gid, "{name}: group");
            } else if m.is_dir() {
                assert_eq!(mode(&m), 0o700, "{name}: {:o}", mode(&m));
            } else {
                assert_eq!(mode(&m), 0o600, "{name}: {:o}", mode(&m));
            }
            if name.starts_with("store/objects/") && m.is_file() {
                objects += 1;
            }
            seen.insert(name);
        }
        assert!(objects >= 4, "{}: {objects} object files", n.data);
        for f in [
            "nbd.sock",
            "node.lock",
            "node.log",
            "node.stderr",
            "recovery.json",
            "meta/raft.redb",
            "store/LOCK",
            "tls/server-key.pem",
        ] {
            assert!(seen.contains(f), "{}: no {f} in {seen:?}", n.data);
        }
    }
    // What `drove up` writes beside the nodes.
    for f in ["cluster.json", "admin.token", "tls/ca-key.pem"] {
        let m = std::fs::metadata(c.dir.path().join(f)).unwrap();
        assert_eq!(mode(&m), 0o600, "{f}: {:o}", mode(&m));
    }

    if !is_root() {
        skip("the rest tries as another user, which needs root");
        return;
    }
    // Another local user can read nothing and attach nothing.
    let data = Path::new(&c.nodes[0].data);
    let object = walk(&data.join("store/objects"))
        .into_iter()
        .find(|(_, m)| m.is_file())
        .unwrap()
        .0;
    for f in [data.join("meta/raft.redb"), object] {
        let o = run(Command::new("cat").arg(&f).uid(NOBODY).gid(NOBODY));
        assert!(!o.status.success(), "another user read {}", f.display());
    }
    let as_nobody = |gid: u32| {
        run(Command::new("qemu-io")
            .args(["-f", "raw", "-c", "read -P 0x5a 0 64k", &uri])
            .uid(NOBODY)
            .gid(gid))
    };
    let o = as_nobody(NOBODY);
    assert!(
        !o.status.success() || text(&o).contains("failed"),
        "another user attached through the socket: {}",
        text(&o)
    );
    // A member of the socket's group (the node's, here) attaches and reads, and
    // still reads no file.
    let o = as_nobody(gid);
    assert!(
        o.status.success() && !text(&o).contains("fail"),
        "the socket's group could not attach: {}",
        text(&o)
    );
    let o = run(Command::new("cat")
        .arg(data.join("meta/raft.redb"))
        .uid(NOBODY)
        .gid(gid));
    assert!(!o.status.success(), "the socket's group read raft.redb");
}

#[test]
fn test_nbd_socket_group_gives_the_socket_and_the_data_dir_that_group() {
    if !require(&["qemu-io"]) {
        return;
    }
    if !is_root() {
        // Only root may give a file to a group it is not in.
        skip("needs root to use a group the test's user is not in");
        return;
    }
    let mut c = start_under_umask_000(1);
    c.create_vdi("g1", "4M", &[]);
    let uri = c.nodes[0].uri("g1");
    let out = qemu_io(&uri, &["write -P 0x33 0 64k".to_string()]);
    assert!(!out.contains("failed"), "{out}");
    const GROUP: u32 = 4242;
    c.kill(0);
    c.restart_with(0, &["--nbd-socket-group", &GROUP.to_string()]);
    let data = Path::new(&c.nodes[0].data);
    let top = std::fs::metadata(data).unwrap();
    assert_eq!((mode(&top), top.gid()), (0o710, GROUP));
    let sock = std::fs::metadata(data.join("nbd.sock")).unwrap();
    assert_eq!((mode(&sock), sock.gid()), (0o660, GROUP));
    let read = |gid: u32| {
        run(Command::new("qemu-io")
            .args(["-f", "raw", "-c", "read -P 0x33 0 64k", &uri])
            .uid(NOBODY)
            .gid(gid))
    };
    let o = read(GROUP);
    assert!(
        o.status.success() && !text(&o).contains("fail"),
        "a member of the group could not attach: {}",
        text(&o)
    );
    let o = read(NOBODY);
    assert!(
        !o.status.success() || text(&o).contains("failed"),
        "a user outside the group attached: {}",
        text(&o)
    );
    // A group that does not exist stops the node with a clear message.
    let o = run(Command::new(drove_bin()).args([
        "node",
        "run",
        "--data",
        &c.dir.path().join("other").display().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--nbd-socket-group",
        "no-such-group-for-drove",
    ]));
    assert!(!o.status.success());
    assert!(
        text(&o).contains("Unknown group 'no-such-group-for-drove'"),
        "{}",
        text(&o)
    );
}

/// Whether a user of class `shift` (3: group, 0: other) can reach `path` below
/// `top` (search on every directory from `top` down to its parent) and has `bits`
/// on it (4 read, 2 write).
fn reachable(top: &Path, path: &Path, shift: u32, bits: u32) -> bool {
    let mut dir = path.parent();
    while let Some(d) = dir {
        let m = std::fs::metadata(d).unwrap();
        if mode(&m) >> shift & 1 == 0 {
            return false;
        }
        if d == top {
            break;
        }
        dir = d.parent();
    }
    let m = std::fs::symlink_metadata(path).unwrap();
    mode(&m) >> shift & bits != 0
}

#[test]
fn test_a_data_dir_left_open_by_an_older_node_is_closed_at_restart() {
    if !require(&["qemu-io"]) {
        return;
    }
    let mut c = Cluster::start(1, 1);
    c.create_vdi("old", "8M", &[]);
    let out = qemu_io(&c.nodes[0].uri("old"), &["write -P 0x11 0 4M".to_string()]);
    assert!(!out.contains("failed"), "{out}");
    c.kill(0);
    // As a node of an older drove left it under umask 022: objects 0644 in 0755
    // directories.
    let data = PathBuf::from(&c.nodes[0].data);
    for (p, m) in walk(&data)
        .into_iter()
        .chain([(data.clone(), std::fs::metadata(&data).unwrap())])
    {
        let open = if m.is_dir() { 0o755 } else { 0o644 };
        if !m.file_type().is_symlink() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(open)).unwrap();
        }
    }
    let object = walk(&data.join("store/objects"))
        .into_iter()
        .find(|(_, m)| m.is_file())
        .unwrap()
        .0;
    assert!(reachable(&data, &object, 0, 4), "the setup opened it");
    c.restart(0);
    let mut files = 0;
    for (p, m) in walk(&data) {
        let name = p.strip_prefix(&data).unwrap().display().to_string();
        for (class, shift) in [("group", 3), ("other", 0)] {
            if m.file_type().is_socket() {
                assert_eq!(name, "nbd.sock");
                assert_eq!(
                    reachable(&data, &p, shift, 2),
                    class == "group",
                    "{name}: {class} {:o}",
                    mode(&m)
                );
            } else if !m.is_dir() {
                files += 1;
                assert!(
                    !reachable(&data, &p, shift, 4 | 2),
                    "{class} can still reach {name} ({:o})",
                    mode(&m)
                );
            }
        }
    }
    assert!(files > 4, "{files} files");
    // And the node still serves what it held.
    let out = qemu_io(&c.nodes[0].uri("old"), &["read -P 0x11 0 4M".to_string()]);
    assert!(!out.contains("failed"), "{out}");
}
