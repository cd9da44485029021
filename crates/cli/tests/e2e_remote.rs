//! The data commands from a host that reaches the nodes only over the network: on a
//! cluster of `drove up` (TLS and tokens on, as by default), with every node's unix
//! socket moved out of the CLI's sight, `vdi import` and `export` (files and
//! streams), `export-diff` and `import-diff` go through a node's NBD TCP port with
//! TLS and the client certificate of DROVE_CA, and every byte arrives intact.
//!
//! Why this proves the TCP+TLS path: the CLI uses a node's unix socket only when the
//! socket's path exists on its host, and here no node's path does (the sockets are
//! renamed, the nodes keep serving on them, and the test reads through them to
//! check the data); the nodes' TCP ports refuse any client that does not start TLS
//! with a certificate of the cluster CA (`--nbd-tls require`, the default).
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const MIB: usize = 1 << 20;

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what} failed: {}", text(&o));
    o
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `len` bytes that do not repeat (xorshift from `seed`).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `drove ARGS` against node `i` as [`Cluster::drove`] runs it, with stdin from
/// `input` and stdout into `output` (the streaming commands).
fn drove_piped(c: &Cluster, i: usize, args: &[&str], input: Stdio, output: Stdio) -> Output {
    let mut cmd = Command::new(drove_bin());
    cmd.args(args).args(["--cluster", &c.nodes[i].admin]);
    if let Some(t) = &c.nodes[i].admin_token_file {
        cmd.env("DROVE_TOKEN_FILE", t);
    }
    if let Some(t) = &c.tls {
        cmd.env("DROVE_CA", &t.dir);
    }
    cmd.stdin(input).stdout(output).stderr(Stdio::piped());
    cmd.output().unwrap()
}

#[test]
fn test_import_export_and_diffs_without_the_unix_socket_go_over_tls() {
    if !require(&["qemu-img", "qemu-io", "nbdcopy"]) {
        return;
    }
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 3, 3, &["--tls", "--auth"]);
    assert!(c.tls.is_some(), "drove up --tls wrote no certificates");
    // Out of the CLI's sight: each node still serves its renamed socket.
    let hidden: Vec<PathBuf> = c
        .nodes
        .iter()
        .map(|n| {
            let to = PathBuf::from(format!("{}.hidden", n.nbd_unix));
            std::fs::rename(&n.nbd_unix, &to).unwrap();
            to
        })
        .collect();
    let gone = || {
        for n in &c.nodes {
            assert!(
                !Path::new(&n.nbd_unix).exists(),
                "{} is back: the CLI could have used it",
                n.nbd_unix
            );
        }
    };
    let local = |i: usize, vdi: &str| format!("nbd+unix:///{vdi}?socket={}", p(&hidden[i]));
    let tmp = tempfile::tempdir().unwrap();
    let read = |i: usize, vdi: &str, len: usize| read_image(&local(i, vdi), tmp.path(), len);

    // 24 MiB: data, 8 MiB of zeros, data.
    let mut image = noise(24 * MIB, 7);
    image[8 * MIB..16 * MIB].fill(0);
    let img = tmp.path().join("disk.raw");
    std::fs::write(&img, &image).unwrap();

    // import, through node 2.
    let s = json(&ok(
        c.drove(0, &["vdi", "import", p(&img), "v", "--node", "2", "--json"]),
        "import",
    ));
    gone();
    assert_eq!(
        (s["node"].as_u64(), s["via"].as_str()),
        (Some(2), Some("tls")),
        "{s}"
    );
    assert!(read(0, "v", image.len()) == image, "imported bytes differ");

    // export, raw and qcow2.
    let out = tmp.path().join("out.raw");
    let s = json(&ok(
        c.drove(1, &["vdi", "export", "v", p(&out), "--json"]),
        "export",
    ));
    gone();
    assert_eq!(s["via"], "tls", "{s}");
    assert!(
        std::fs::read(&out).unwrap() == image,
        "exported bytes differ"
    );
    let q = tmp.path().join("out.qcow2");
    ok(
        c.drove(2, &["vdi", "export", "v", p(&q), "--format", "qcow2"]),
        "export qcow2",
    );
    let o = run(Command::new("qemu-img").args(["compare", "-q", p(&q), p(&img)]));
    assert!(o.status.success(), "qcow2 export differs: {}", text(&o));

    // The streams: export to stdout, import from stdin.
    let streamed = tmp.path().join("streamed.raw");
    let f = std::fs::File::create(&streamed).unwrap();
    ok(
        drove_piped(&c, 0, &["vdi", "export", "v", "-"], Stdio::null(), f.into()),
        "export -",
    );
    assert!(
        std::fs::read(&streamed).unwrap() == image,
        "streamed export differs"
    );
    let f = std::fs::File::open(&img).unwrap();
    let o = ok(
        drove_piped(
            &c,
            1,
            &["vdi", "import", "-", "w", "--size", "24M", "--json"],
            f.into(),
            Stdio::piped(),
        ),
        "import -",
    );
    gone();
    assert_eq!(json(&o)["via"], "tls", "{}", text(&o));
    assert!(
        read(1, "w", image.len()) == image,
        "streamed import differs"
    );

    // export-diff and import-diff: a full diff of s1 and an incremental one to s2.
    ok(c.drove(0, &["vdi", "snapshot", "v", "s1"]), "snapshot s1");
    qemu_io(
        &local(0, "v"),
        &[
            "write -P 0x5a 1M 64k".to_string(),
            "write -z 17M 1M".to_string(),
            "write -P 0xc3 23M 1M".to_string(),
        ],
    );
    ok(c.drove(0, &["vdi", "snapshot", "v", "s2"]), "snapshot s2");
    let full = tmp.path().join("full.diff");
    let inc = tmp.path().join("inc.diff");
    let s = json(&ok(
        c.drove(
            2,
            &["vdi", "export-diff", "v", "--to", "s1", p(&full), "--json"],
        ),
        "full export-diff",
    ));
    assert_eq!(s["via"], "tls", "{s}");
    let s = json(&ok(
        c.drove(
            1,
            &[
                "vdi",
                "export-diff",
                "v",
                "--from",
                "s1",
                "--to",
                "s2",
                p(&inc),
                "--json",
            ],
        ),
        "incremental export-diff",
    ));
    assert_eq!(s["via"], "tls", "{s}");
    let s = json(&ok(
        c.drove(
            0,
            &[
                "vdi",
                "import-diff",
                p(&full),
                "r",
                "--snapshot",
                "r1",
                "--json",
            ],
        ),
        "import the full diff",
    ));
    assert_eq!(s["via"], "tls", "{s}");
    let s = json(&ok(
        c.drove(
            1,
            &["vdi", "import-diff", p(&inc), "r", "--base", "r1", "--json"],
        ),
        "import the incremental diff",
    ));
    gone();
    assert_eq!(s["via"], "tls", "{s}");
    let want = read(2, "s2", image.len());
    assert!(want != image, "the writes between s1 and s2 did not happen");
    assert!(read(2, "r1", image.len()) == image, "r1 is not s1");
    assert!(read(2, "r", image.len()) == want, "r is not s2");
}
