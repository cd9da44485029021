//! `drove vdi import-diff` checks before it writes: an incremental diff is refused,
//! leaving the VDI as it was, unless the VDI holds the diff's base; a diff with one
//! altered byte, or cut short, or of the old format is refused before anything is
//! created or written. And the README's backup commands work as written.
mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};

fn ok(o: Output, what: &str) -> Output {
    assert!(o.status.success(), "{what} failed: {}", text(&o));
    o
}

/// The error of a command that must fail; it must claim no success on stdout.
fn failed(o: Output, what: &str) -> String {
    assert!(
        !o.status.success(),
        "{what} should have failed: {}",
        text(&o)
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("Applied"),
        "{what}: {}",
        text(&o)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Whether the disks at two NBD URIs read the same (`qemu-img compare`).
fn same(a: &str, b: &str) -> bool {
    let o = run(Command::new("qemu-img").args(["compare", "-q", a, b]));
    match o.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("qemu-img compare {a} {b}: {}", text(&o)),
    }
}

fn size_of(c: &Cluster, vdi: &str) -> u64 {
    let o = ok(c.drove(0, &["vdi", "info", vdi, "--json"]), "vdi info");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["size"].as_u64().unwrap_or_else(|| panic!("no size: {v}"))
}

/// A copy of `from` at `to` with the byte at `at` changed.
fn altered(from: &Path, to: &Path, at: usize) {
    let mut b = std::fs::read(from).unwrap();
    b[at] ^= 0x01;
    std::fs::write(to, b).unwrap();
}

/// Where `pattern` (16 bytes of it) first occurs in file `f`: inside a data record.
fn data_at(f: &Path, pattern: u8) -> usize {
    let b = std::fs::read(f).unwrap();
    b.windows(16)
        .position(|w| w.iter().all(|&x| x == pattern))
        .unwrap_or_else(|| panic!("no {pattern:#x} data in {}", f.display()))
}

#[test]
fn test_import_diff_refuses_a_wrong_base_and_damaged_diffs_before_writing() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let c = Cluster::start(3, 3);
    let tmp = tempfile::tempdir().unwrap();
    let uri = |v: &str| c.nodes[0].uri(v);
    c.create_vdi("vm", "16M", &["--copies", "2"]);
    qemu_io(&uri("vm"), &["write -P 0x11 0 16M".to_string()]);
    ok(c.drove(0, &["vdi", "snapshot", "vm", "s1"]), "snapshot s1");
    qemu_io(
        &uri("vm"),
        &[
            "write -P 0x22 5M 1M".to_string(),
            "write -z 9M 1M".to_string(),
        ],
    );
    ok(c.drove(0, &["vdi", "snapshot", "vm", "s2"]), "snapshot s2");
    let full = tmp.path().join("full.diff");
    let inc = tmp.path().join("inc.diff");
    ok(
        c.drove(0, &["vdi", "export-diff", "vm", "--to", "s1", p(&full)]),
        "full export-diff",
    );
    ok(
        c.drove(
            0,
            &[
                "vdi",
                "export-diff",
                "vm",
                "--from",
                "s1",
                "--to",
                "s2",
                p(&inc),
            ],
        ),
        "incremental export-diff",
    );
    let apply = |diff: &Path, vdi: &str, extra: &[&str]| {
        let mut args = vec!["vdi", "import-diff", p(diff), vdi];
        args.extend_from_slice(extra);
        c.drove(0, &args)
    };

    // A VDI that never had the base: other data, taken from its own snapshot.
    c.create_vdi("other", "16M", &[]);
    qemu_io(&uri("other"), &["write -P 0x33 0 16M".to_string()]);
    ok(
        c.drove(0, &["vdi", "snapshot", "other", "o1"]),
        "snapshot o1",
    );
    let e = failed(apply(&inc, "other", &["--base", "o1"]), "wrong base");
    assert!(
        e.contains("does not hold what the diff's base 's1' held")
            && e.contains("nothing was written"),
        "{e}"
    );
    qemu_io(&uri("other"), &["read -P 0x33 0 16M".to_string()]);
    // Without --base the base is the snapshot named as the diff's --from.
    let e = failed(apply(&inc, "other", &[]), "no such base");
    assert!(
        e.contains("does not come from a snapshot of that name"),
        "{e}"
    );
    assert!(e.contains("--base"), "{e}");
    // A new, empty and smaller VDI is neither written nor grown.
    c.create_vdi("small", "8M", &[]);
    ok(
        c.drove(0, &["vdi", "snapshot", "small", "sm1"]),
        "snapshot sm1",
    );
    let e = failed(apply(&inc, "small", &["--base", "sm1"]), "smaller VDI");
    assert!(e.contains("'sm1' is not that base"), "{e}");
    assert_eq!(size_of(&c, "small"), 8 << 20);
    // One of the right size, all zeros where s1 has data.
    c.create_vdi("blank", "16M", &[]);
    ok(
        c.drove(0, &["vdi", "snapshot", "blank", "b1"]),
        "snapshot b1",
    );
    let e = failed(apply(&inc, "blank", &["--base", "b1"]), "empty VDI");
    assert!(e.contains("does not hold what the diff's base"), "{e}");
    qemu_io(&uri("blank"), &["read -P 0 0 16M".to_string()]);

    // The right base, but written since its snapshot: refused until rolled back.
    ok(
        apply(&full, "r", &["--snapshot", "r1"]),
        "restore the full diff",
    );
    assert!(same(&uri("r1"), &uri("s1")));
    qemu_io(&uri("r"), &["write -P 0x44 12M 4k".to_string()]);
    let e = failed(apply(&inc, "r", &["--base", "r1"]), "written since");
    assert!(
        e.contains("was written since snapshot 'r1'") && e.contains("drove vdi rollback r r1"),
        "{e}"
    );
    qemu_io(&uri("r"), &["read -P 0x44 12M 4k".to_string()]);
    ok(c.drove(0, &["vdi", "rollback", "r", "r1"]), "rollback");

    // One altered byte in a data record: refused, nothing written or created.
    let bad = tmp.path().join("bad.diff");
    altered(&inc, &bad, data_at(&inc, 0x22) + 1000);
    let e = failed(apply(&bad, "r", &["--base", "r1"]), "altered incremental");
    assert!(
        e.contains("fails its checksum") && e.contains("nothing was written"),
        "{e}"
    );
    assert!(same(&uri("r"), &uri("s1")), "r changed");
    altered(&full, &bad, data_at(&full, 0x11) + 123_456);
    let e = failed(apply(&bad, "x", &[]), "altered full");
    assert!(e.contains("fails its checksum"), "{e}");
    // Cut short: refused the same way.
    let b = std::fs::read(&inc).unwrap();
    std::fs::write(&bad, &b[..b.len() - 1]).unwrap();
    let e = failed(apply(&bad, "r", &["--base", "r1"]), "cut incremental");
    assert!(
        e.contains("cut short") && e.contains("nothing was written"),
        "{e}"
    );
    assert!(same(&uri("r"), &uri("s1")), "r changed");
    let b = std::fs::read(&full).unwrap();
    std::fs::write(&bad, &b[..b.len() / 3]).unwrap();
    let e = failed(apply(&bad, "x", &[]), "cut full");
    assert!(e.contains("cut short"), "{e}");
    // The format before checksums: refused with what to do.
    std::fs::write(
        &bad,
        b"drove diff v1\nt\x02\x00\x00\x00s1s\x00\x00\x10\x00\x00\x00\x00\x00e",
    )
    .unwrap();
    let e = failed(apply(&bad, "x", &[]), "a v1 diff");
    assert!(e.contains("format v1") && e.contains("export-diff"), "{e}");
    assert!(!c.vdi_names().contains(&"x".to_string()), "a VDI was made");

    // The right base, untouched: the diff applies, and gives s2.
    ok(apply(&inc, "r", &["--base", "r1"]), "apply on the base");
    assert!(same(&uri("r"), &uri("s2")));
}

/// The README's lines that run `export-diff` or `import-diff`, each split into its
/// commands (`;`), each command into its words, the comment dropped.
fn readme_diff_lines() -> Vec<Vec<Vec<String>>> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(readme).unwrap();
    text.lines()
        .filter(|l| l.starts_with("drove ") && l.contains("-diff "))
        .map(|l| {
            let code = l.split(" #").next().unwrap();
            code.split(" ; ")
                .map(|cmd| cmd.split_whitespace().map(str::to_string).collect())
                .collect()
        })
        .collect()
}

#[test]
fn test_the_readmes_backup_commands_work_as_written() {
    if !require(&["qemu-io", "qemu-img"]) {
        return;
    }
    let lines = readme_diff_lines();
    assert_eq!(
        lines.len(),
        4,
        "the README's backup lines changed; this test runs them: {lines:?}"
    );
    // As the README says: a cluster of `drove up` with TLS and a token, the
    // variables it prints exported, and commands run in the user's directory.
    let c = Cluster::start_with(tempfile::tempdir().unwrap(), 3, 3, &["--tls", "--auth"]);
    let cwd = tempfile::tempdir().unwrap();
    let shell = |line: &[Vec<String>]| {
        for cmd in line {
            assert_eq!(cmd[0], "drove", "{cmd:?}");
            let mut run_it = Command::new(drove_bin());
            run_it
                .args(&cmd[1..])
                .current_dir(cwd.path())
                .env("DROVE_CLUSTER", &c.nodes[0].admin)
                .env("DROVE_CA", &c.tls.as_ref().unwrap().dir)
                .env(
                    "DROVE_TOKEN_FILE",
                    c.nodes[0].admin_token_file.as_ref().unwrap(),
                );
            ok(run(&mut run_it), &cmd.join(" "));
        }
    };
    c.create_vdi("vm1", "64M", &[]);
    let vm1 = c.nodes[1].uri("vm1");
    qemu_io(&vm1, &["write -P 0x5a 0 40M".to_string()]);
    shell(&lines[0]);
    qemu_io(
        &vm1,
        &[
            "write -P 0xa5 8M 2M".to_string(),
            "write -z 30M 1M".to_string(),
            "write -P 0x77 60M 1M".to_string(),
        ],
    );
    for line in &lines[1..] {
        shell(line);
    }
    let uri = |v: &str| c.nodes[2].uri(v);
    assert!(
        same(&uri("vm1-restored"), &uri("tue")),
        "restored is not tue"
    );
    assert!(same(&uri("vm1-mon"), &uri("mon")), "vm1-mon is not mon");
    assert!(
        !same(&uri("mon"), &uri("tue")),
        "nothing changed between mon and tue"
    );
}
