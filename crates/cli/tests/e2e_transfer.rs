//! End-to-end `drove vdi import` / `drove vdi export` on a real 3-node cluster with
//! qemu-img: images come back bit for bit (raw and qcow2), zero ranges of an image are
//! neither sent nor stored, and every refusal leaves VDIs and files untouched.
mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what} failed: {}", text(&o));
    o
}

fn failed(o: Output, what: &str) -> String {
    assert!(
        !o.status.success(),
        "{what} should have failed: {}",
        text(&o)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn qemu_img(args: &[&str]) -> String {
    text(&ok(run(Command::new("qemu-img").args(args)), "qemu-img"))
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Bytes allocated on disk (st_blocks) under every node's `store/`.
fn stored_bytes(c: &Cluster) -> u64 {
    fn walk(dir: &Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return 0;
        };
        rd.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) => m.blocks() * 512,
                Err(_) => 0,
            })
            .sum()
    }
    c.nodes
        .iter()
        .map(|n| walk(&Path::new(&n.data).join("store")))
        .sum()
}

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn test_qcow2_import_then_export_raw_and_qcow2_is_identical() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", p(&src), "100M"]);
    // Data at the start, inside, across no boundary in particular, a zero-written
    // cluster, and the last MiB.
    let mut io = Command::new("qemu-io");
    io.args(["-f", "qcow2"]);
    for w in [
        "write -P 0xaa 0 64k",
        "write -P 0xbb 5M 1M",
        "write -z 20M 1M",
        "write -P 0xcc 52432896 300k",
        "write -P 0xdd 99M 1M",
    ] {
        io.args(["-c", w]);
    }
    ok(run(io.arg(&src)), "qemu-io on the qcow2");

    // Import through node 1: the VDI takes the image's virtual size; nothing is
    // printed while copying when stderr is not a terminal.
    let o = ok(
        c.drove(0, &["vdi", "import", p(&src), "img", "--json"]),
        "import",
    );
    assert!(o.stderr.is_empty(), "stderr: {}", text(&o));
    let s = json(&o);
    assert_eq!(s["op"], "import");
    assert_eq!(s["format"], "qcow2", "detected format: {s}");
    assert_eq!(s["bytes"], 100 * MIB);
    assert!(s["seconds"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["mib_per_s"].as_f64().unwrap() > 0.0, "{s}");
    let info = json(&ok(c.drove(1, &["vdi", "info", "img", "--json"]), "info"));
    assert_eq!(info["size"], 100 * MIB);

    // Export raw through node 3 (asked for through node 2).
    let raw = tmp.path().join("back.raw");
    let id3 = c.nodes[2].id.to_string();
    let o = ok(
        c.drove(1, &["vdi", "export", "img", p(&raw), "--node", &id3]),
        "export raw",
    );
    let t = text(&o);
    assert!(
        t.contains("Exported VDI 'img'") && t.contains(&format!("node {id3}")),
        "{t}"
    );
    let cmp = qemu_img(&["compare", "-f", "qcow2", "-F", "raw", p(&src), p(&raw)]);
    assert!(cmp.contains("Images are identical"), "{cmp}");
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 100 * MIB);
    assert!(
        allocated(&raw) < 16 * MIB,
        "raw export is not sparse: {} bytes allocated",
        allocated(&raw)
    );

    // Export qcow2.
    let q = tmp.path().join("back.qcow2");
    ok(
        c.drove(
            0,
            &["vdi", "export", "img", p(&q), "--format", "qcow2", "--json"],
        ),
        "export qcow2",
    );
    let qi = qemu_img(&["info", "--output=json", p(&q)]);
    assert!(qi.contains("\"format\": \"qcow2\""), "{qi}");
    let cmp = qemu_img(&["compare", "-f", "qcow2", "-F", "qcow2", p(&src), p(&q)]);
    assert!(cmp.contains("Images are identical"), "{cmp}");
    // Spot-check the data itself through another node, not only qemu-img's verdict.
    qemu_io(
        &c.nodes[2].uri("img"),
        &[
            "read -P 0xaa 0 64k".into(),
            "read -P 0xbb 5M 1M".into(),
            "read -P 0 20M 1M".into(),
            "read -P 0xcc 52432896 300k".into(),
            "read -P 0xdd 99M 1M".into(),
        ],
    );
}

/// Random bytes from a xorshift generator (no extra crate, reproducible).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

#[test]
fn test_sparse_raw_import_stores_only_the_data() {
    if !require(&["qemu-img"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("sparse.raw");
    // 1 GiB, 8 MiB of it random data: at the start, across the 4 MiB object boundary,
    // unaligned to objects, and at the very end.
    let spots: [(u64, u64); 6] = [
        (0, MIB),
        (4 * MIB - 512 * 1024, MIB),
        (100 * MIB, 2 * MIB),
        (512 * MIB + 12288, MIB),
        (900 * MIB, 2 * MIB),
        (1024 * MIB - MIB, MIB),
    ];
    let data: u64 = spots.iter().map(|s| s.1).sum();
    assert_eq!(data, 8 * MIB);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(1024 * MIB).unwrap();
        for (i, (off, len)) in spots.iter().enumerate() {
            f.write_all_at(&noise(*len as usize, i as u64 + 7), *off)
                .unwrap();
        }
        f.sync_all().unwrap();
    }
    let before = stored_bytes(&c);
    let o = ok(
        c.drove(
            0,
            &[
                "vdi",
                "import",
                p(&src),
                "sparse",
                "--copies",
                "3",
                "--json",
            ],
        ),
        "import",
    );
    let s = json(&o);
    assert_eq!(s["format"], "raw", "{s}");
    assert_eq!(s["bytes"], 1024 * MIB);
    assert_eq!(s["data_bytes"], data, "qemu-img map of the source: {s}");

    let stored = stored_bytes(&c) - before;
    let copies = 3;
    let budget = copies * data * 3 / 2 + 2 * MIB;
    eprintln!(
        "sparse import: {data} data bytes, {stored} bytes stored over {copies} copies ({:.2}x data per copy), budget {budget}",
        stored as f64 / (copies * data) as f64
    );
    assert!(
        stored <= budget,
        "stored {stored} bytes for {data} bytes of data x{copies}: zero ranges were stored"
    );
    assert!(
        stored >= copies * data,
        "stored {stored} bytes: fewer than {copies} full copies of {data} bytes"
    );

    let back = tmp.path().join("back.raw");
    let id2 = c.nodes[1].id.to_string();
    ok(
        c.drove(2, &["vdi", "export", "sparse", p(&back), "--node", &id2]),
        "export",
    );
    let cmp = qemu_img(&["compare", "-f", "raw", "-F", "raw", p(&src), p(&back)]);
    assert!(cmp.contains("Images are identical"), "{cmp}");
    let out = allocated(&back);
    eprintln!("sparse export: {out} bytes allocated in the 1 GiB output file");
    assert!(
        out < 32 * MIB,
        "export is not sparse: {out} bytes allocated"
    );
}

#[test]
fn test_refusals_leave_vdis_and_files_untouched() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let tmp = tempfile::tempdir().unwrap();

    // A missing file: clear message, nothing created.
    let missing = tmp.path().join("nope.img");
    let e = failed(
        c.drove(0, &["vdi", "import", p(&missing), "ghost"]),
        "import of a missing file",
    );
    assert!(e.contains("no such file") && e.contains("nope.img"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "one-line error: {e}");
    assert!(!c.vdi_names().contains(&"ghost".to_string()));

    // An existing VDI: refused before anything is written to it.
    c.create_vdi("keep", "64M", &["--copies", "3"]);
    let pattern = ["write -P 0x5a 1M 1M".to_string(), "flush".to_string()];
    qemu_io(&c.nodes[0].uri("keep"), &pattern);
    let img = tmp.path().join("other.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", p(&img), "32M"]);
    ok(
        run(Command::new("qemu-io").args(["-f", "qcow2", "-c", "write -P 0x33 1M 1M", p(&img)])),
        "qemu-io",
    );
    let e = failed(
        c.drove(1, &["vdi", "import", p(&img), "keep"]),
        "import over a VDI",
    );
    assert!(e.contains("'keep' already exists"), "{e}");
    let info = json(&ok(c.drove(0, &["vdi", "info", "keep", "--json"]), "info"));
    assert_eq!(
        info["size"],
        64 * MIB,
        "the existing VDI was resized: {info}"
    );
    qemu_io(&c.nodes[1].uri("keep"), &["read -P 0x5a 1M 1M".to_string()]);

    // An unknown --node: refused before the VDI is created.
    let e = failed(
        c.drove(0, &["vdi", "import", p(&img), "n9", "--node", "99"]),
        "import via node 99",
    );
    assert!(e.contains("No node 99"), "{e}");
    assert!(!c.vdi_names().contains(&"n9".to_string()));

    // A copy that fails half-way (a qcow2 whose first L1 entry is corrupt): the VDI
    // the import created is deleted again and the error says why.
    let bad = tmp.path().join("bad.qcow2");
    let mut b = std::fs::read(&img).unwrap();
    let l1 = u64::from_be_bytes(b[40..48].try_into().unwrap()) as usize;
    let entry = u64::from_be_bytes(b[l1..l1 + 8].try_into().unwrap());
    assert_ne!(entry, 0, "the test image has no L2 table");
    b[l1..l1 + 8].copy_from_slice(&(entry + 512).to_be_bytes());
    std::fs::write(&bad, &b).unwrap();
    let e = failed(
        c.drove(0, &["vdi", "import", p(&bad), "broken"]),
        "import of a corrupt qcow2",
    );
    assert!(e.contains("deleted again") && e.contains("corrupt"), "{e}");
    assert!(!c.vdi_names().contains(&"broken".to_string()));

    // An existing file: not replaced without --force, and no temporary file is left.
    let dst = tmp.path().join("precious.raw");
    std::fs::write(&dst, b"precious").unwrap();
    let listing = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let files = listing(tmp.path());
    let e = failed(
        c.drove(0, &["vdi", "export", "keep", p(&dst)]),
        "export over a file",
    );
    assert!(e.contains("already exists") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&dst).unwrap(), b"precious");
    // A VDI that does not exist: refused, the file is still untouched.
    let e = failed(
        c.drove(0, &["vdi", "export", "nosuch", p(&dst), "--force"]),
        "export of no VDI",
    );
    assert!(e.contains("nosuch"), "{e}");
    assert_eq!(std::fs::read(&dst).unwrap(), b"precious");
    assert_eq!(
        listing(tmp.path()),
        files,
        "a temporary file was left behind"
    );
    // With --force it is replaced by the VDI's contents.
    ok(
        c.drove(0, &["vdi", "export", "keep", p(&dst), "--force"]),
        "export --force",
    );
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), 64 * MIB);
    let got = std::fs::read(&dst).unwrap();
    assert!(got[MIB as usize..2 * MIB as usize]
        .iter()
        .all(|&x| x == 0x5a));
    assert!(got[..MIB as usize].iter().all(|&x| x == 0));
    assert_eq!(
        listing(tmp.path()),
        files,
        "a temporary file was left behind"
    );
}

/// `qemu-img compare` of two NBD exports: identical or not.
fn same(a: &str, b: &str) -> bool {
    let o = run(Command::new("qemu-img").args(["compare", "-q", a, b]));
    match o.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("qemu-img compare {a} {b}: {}", text(&o)),
    }
}

/// An incremental backup: a full diff of the first snapshot and a diff between two
/// snapshots restore, applied in order to a new VDI (the second onto the snapshot
/// the first left, named with --base), a disk identical to each snapshot; the
/// incremental diff holds only what changed (1 MiB of data and 1 MiB of zeros of a
/// 64 MiB disk); `-` streams the same bytes; bad input is refused with a reason and
/// leaves no half-made VDI. (More refusals: e2e_diff.)
#[test]
fn test_export_diff_between_snapshots_and_import_diff_restore_them() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let tmp = tempfile::tempdir().unwrap();
    c.create_vdi("vm", "64M", &["--copies", "2"]);
    let vm = c.nodes[0].uri("vm");
    qemu_io(
        &vm,
        &[
            "write -P 0x11 0 64M".to_string(),
            "write -z 20M 1M".to_string(),
        ],
    );
    ok(c.drove(0, &["vdi", "snapshot", "vm", "s1"]), "snapshot s1");
    // What changes: 1 MiB of data in object 1, 1 MiB zeroed in object 10.
    qemu_io(
        &vm,
        &[
            "write -P 0x22 5M 1M".to_string(),
            "write -z 40M 1M".to_string(),
        ],
    );
    ok(c.drove(0, &["vdi", "snapshot", "vm", "s2"]), "snapshot s2");

    let full = tmp.path().join("full.diff");
    let s = json(&ok(
        c.drove(
            0,
            &["vdi", "export-diff", "vm", "--to", "s1", p(&full), "--json"],
        ),
        "full export-diff",
    ));
    assert_eq!(s["op"], "export-diff");
    assert_eq!(s["objects"], 16, "{s}");
    // 64 MiB written, 1 MiB of it zeroed again: only the data is in a full diff.
    assert_eq!(s["data_bytes"], 63 * MIB, "{s}");
    assert_eq!(
        s["file_bytes"],
        std::fs::metadata(&full).unwrap().len(),
        "{s}"
    );

    let inc = tmp.path().join("inc.diff");
    let s = json(&ok(
        c.drove(
            1,
            &[
                "vdi",
                "export-diff",
                "vm",
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
    assert_eq!(s["objects"], 2, "{s}");
    assert_eq!(s["data_bytes"], MIB, "{s}");
    assert_eq!(s["zero_bytes"], MIB, "{s}");
    let inc_len = std::fs::metadata(&inc).unwrap().len();
    eprintln!("incremental diff of a 64 MiB disk: {inc_len} bytes");
    assert!(inc_len > MIB && inc_len < MIB + 4096, "{inc_len} bytes");

    // `-` writes the same diff to stdout.
    let streamed = tmp.path().join("streamed.diff");
    let out = std::fs::File::create(&streamed).unwrap();
    let st = Command::new(drove_bin())
        .args([
            "vdi",
            "export-diff",
            "vm",
            "--from",
            "s1",
            "--to",
            "s2",
            "-",
        ])
        .args(["--cluster", &c.nodes[2].admin])
        .stdout(out)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        std::fs::read(&streamed).unwrap(),
        std::fs::read(&inc).unwrap()
    );

    // Restore in order: full, then incremental, each ending in a snapshot.
    let s = json(&ok(
        c.drove(
            0,
            &[
                "vdi",
                "import-diff",
                p(&full),
                "restored",
                "--snapshot",
                "r1",
                "--json",
            ],
        ),
        "import the full diff",
    ));
    assert_eq!(s["data_bytes"], 63 * MIB, "{s}");
    assert!(same(&c.nodes[1].uri("r1"), &c.nodes[1].uri("s1")));
    ok(
        c.drove(
            2,
            &[
                "vdi",
                "import-diff",
                p(&inc),
                "restored",
                "--base",
                "r1",
                "--snapshot",
                "r2",
            ],
        ),
        "import the incremental diff",
    );
    assert!(same(&c.nodes[0].uri("r2"), &c.nodes[0].uri("s2")));
    assert!(same(&c.nodes[0].uri("restored"), &c.nodes[0].uri("s2")));
    assert!(!same(&c.nodes[0].uri("r1"), &c.nodes[0].uri("s2")));
    // Applying it again is refused: 'restored' no longer holds the base.
    let e = failed(
        c.drove(
            0,
            &["vdi", "import-diff", p(&inc), "restored", "--base", "r2"],
        ),
        "import the incremental diff again",
    );
    assert!(
        e.contains("does not hold what the diff's base 's1' held"),
        "{e}"
    );
    assert!(same(&c.nodes[0].uri("restored"), &c.nodes[0].uri("s2")));

    // Refusals.
    let e = failed(
        c.drove(
            0,
            &[
                "vdi",
                "export-diff",
                "vm",
                "--from",
                "s2",
                "--to",
                "s1",
                p(&tmp.path().join("x")),
            ],
        ),
        "export-diff backwards",
    );
    assert!(e.contains("not an older snapshot"), "{e}");
    let e = failed(
        c.drove(0, &["vdi", "export-diff", "vm", "--to", "s1", p(&full)]),
        "export-diff over a file",
    );
    assert!(e.contains("--force"), "{e}");
    let e = failed(
        c.drove(0, &["vdi", "import-diff", p(&inc), "nothere"]),
        "incremental diff into no VDI",
    );
    assert!(e.contains("only what changed since snapshot 's1'"), "{e}");
    let e = failed(
        c.drove(0, &["vdi", "import-diff", p(&full), "restored"]),
        "full diff into an existing VDI",
    );
    assert!(e.contains("full diff"), "{e}");
    let cut = tmp.path().join("cut.diff");
    let bytes = std::fs::read(&full).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = failed(
        c.drove(0, &["vdi", "import-diff", p(&cut), "halfway"]),
        "a cut diff",
    );
    assert!(e.contains("cut short"), "{e}");
    assert!(e.contains("nothing was written"), "{e}");
    assert!(!c.vdi_names().contains(&"halfway".to_string()));
    let e = failed(
        c.drove(0, &["vdi", "import-diff", p(&tmp.path().join("none")), "x"]),
        "no file",
    );
    assert!(e.contains("Cannot read"), "{e}");
}
