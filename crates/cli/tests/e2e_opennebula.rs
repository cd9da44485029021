//! The OpenNebula drivers in `integrations/opennebula/` against a real 3-node
//! cluster. OpenNebula itself is not installed: each datastore script is run as
//! `one_datastore.rb` runs it (`datastore/drove/ACTION ID` with the base64
//! DS_DRIVER_ACTION_DATA document on stdin) and each transfer-manager script as
//! `one_tm.rb` runs it (`tm/drove/ACTION ARGS...` in the order TransferManager.cc
//! writes them, no stdin), then its stdout and the cluster's VDI table are checked.
//! A second test boots a VM from a disk `tm/drove/clone` made, through the libvirt
//! disk the deploy filter writes, and a third an ephemeral clone.
mod common;
use common::vm::VmKit;
use common::*;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `integrations/opennebula` of this repository.
fn integ() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integrations/opennebula")
}

fn b64(data: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The DATASTORE element of a DS_DRIVER_ACTION_DATA, as oned writes it for an
/// image datastore (TYPE 0) or a system datastore (TYPE 1) of DS_MAD/TM_MAD drove.
fn datastore_xml(id: u32, system: bool) -> String {
    let (ty, tyname) = if system {
        (1, "SYSTEM_DS")
    } else {
        (0, "IMAGE_DS")
    };
    format!(
        "<DATASTORE><ID>{id}</ID><UID>0</UID><GID>0</GID><UNAME>oneadmin</UNAME>\
         <GNAME>oneadmin</GNAME><NAME>drove-{id}</NAME><PERMISSIONS><OWNER_U>1</OWNER_U>\
         <OWNER_M>1</OWNER_M><OWNER_A>0</OWNER_A><GROUP_U>1</GROUP_U><GROUP_M>0</GROUP_M>\
         <GROUP_A>0</GROUP_A><OTHER_U>0</OTHER_U><OTHER_M>0</OTHER_M><OTHER_A>0</OTHER_A>\
         </PERMISSIONS><DS_MAD><![CDATA[drove]]></DS_MAD><TM_MAD><![CDATA[drove]]></TM_MAD>\
         <BASE_PATH><![CDATA[/var/lib/one//datastores/{id}]]></BASE_PATH><TYPE>{ty}</TYPE>\
         <DISK_TYPE>0</DISK_TYPE><STATE>0</STATE><CLUSTERS><ID>0</ID></CLUSTERS>\
         <TOTAL_MB>0</TOTAL_MB><FREE_MB>0</FREE_MB><USED_MB>0</USED_MB><IMAGES/>\
         <TEMPLATE><ALLOW_ORPHANS><![CDATA[YES]]></ALLOW_ORPHANS>\
         <CLONE_TARGET><![CDATA[SELF]]></CLONE_TARGET><DISK_TYPE><![CDATA[FILE]]></DISK_TYPE>\
         <DS_MAD><![CDATA[drove]]></DS_MAD><LN_TARGET><![CDATA[NONE]]></LN_TARGET>\
         <RESTRICTED_DIRS><![CDATA[/]]></RESTRICTED_DIRS><SAFE_DIRS><![CDATA[/var/tmp]]></SAFE_DIRS>\
         <TM_MAD><![CDATA[drove]]></TM_MAD><TYPE><![CDATA[{tyname}]]></TYPE></TEMPLATE></DATASTORE>"
    )
}

/// The DS_DRIVER_ACTION_DATA of an image action, base64-encoded as oned sends it.
/// `source` is the image's SOURCE (empty before it is registered), `path` its PATH.
fn image_action(id: u32, source: &str, path: &str, size_mb: u64, format: &str) -> String {
    let xml = format!(
        "<DS_DRIVER_ACTION_DATA><IMAGE><ID>{id}</ID><UID>0</UID><GID>0</GID>\
         <UNAME>oneadmin</UNAME><GNAME>oneadmin</GNAME><NAME>image-{id}</NAME>\
         <PERMISSIONS><OWNER_U>1</OWNER_U><OWNER_M>1</OWNER_M><OWNER_A>0</OWNER_A>\
         <GROUP_U>0</GROUP_U><GROUP_M>0</GROUP_M><GROUP_A>0</GROUP_A><OTHER_U>0</OTHER_U>\
         <OTHER_M>0</OTHER_M><OTHER_A>0</OTHER_A></PERMISSIONS><TYPE>0</TYPE>\
         <DISK_TYPE>0</DISK_TYPE><PERSISTENT>0</PERSISTENT><REGTIME>1795450000</REGTIME>\
         <SOURCE><![CDATA[{source}]]></SOURCE><PATH><![CDATA[{path}]]></PATH>\
         <FORMAT><![CDATA[{format}]]></FORMAT><FS><![CDATA[]]></FS><SIZE>{size_mb}</SIZE>\
         <STATE>4</STATE><PREV_STATE>0</PREV_STATE><RUNNING_VMS>0</RUNNING_VMS>\
         <CLONING_OPS>0</CLONING_OPS><CLONING_ID>-1</CLONING_ID><TARGET_SNAPSHOT>-1</TARGET_SNAPSHOT>\
         <DATASTORE_ID>100</DATASTORE_ID><DATASTORE>drove-100</DATASTORE><VMS/><CLONES/>\
         <APP_CLONES/><TEMPLATE><DEV_PREFIX><![CDATA[vd]]></DEV_PREFIX></TEMPLATE>\
         <SNAPSHOTS><ALLOW_ORPHANS><![CDATA[YES]]></ALLOW_ORPHANS><CURRENT_BASE><![CDATA[-1]]></CURRENT_BASE>\
         <NEXT_SNAPSHOT><![CDATA[0]]></NEXT_SNAPSHOT></SNAPSHOTS></IMAGE>{}</DS_DRIVER_ACTION_DATA>",
        datastore_xml(100, false)
    );
    b64(xml.as_bytes())
}

/// The DS_DRIVER_ACTION_DATA of a datastore monitor.
fn monitor_action(id: u32, system: bool) -> String {
    b64(format!(
        "<DS_DRIVER_ACTION_DATA>{}<MONITOR_VM_DISKS>0</MONITOR_VM_DISKS></DS_DRIVER_ACTION_DATA>",
        datastore_xml(id, system)
    )
    .as_bytes())
}

/// A cluster plus what the drivers need around it: their configuration file and a
/// directory standing for the hypervisor's /var/lib/one/datastores.
struct One {
    c: Cluster,
    tmp: tempfile::TempDir,
    conf: PathBuf,
}

impl One {
    fn start() -> One {
        let c = Cluster::start(3, 3);
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("drove.conf");
        let one = One { c, tmp, conf };
        one.configure(false);
        one
    }

    /// Write drove.conf (the hypervisor's node is node 1).
    fn configure(&self, ephemeral: bool) {
        std::fs::write(
            &self.conf,
            format!(
                "DROVE_NBD_SOCKET={}\nDROVE_EPHEMERAL_CLONES={}\n",
                self.c.nodes[0].nbd_unix,
                if ephemeral { "yes" } else { "no" }
            ),
        )
        .unwrap();
    }

    /// The system datastore directory of VM `vm` (VM_DIR on the host).
    fn vm_dir(&self, vm: u32) -> PathBuf {
        self.tmp.path().join(format!("datastores/0/{vm}"))
    }

    /// `localhost:VM_DIR/disk.N`, as TransferManager.cc names a disk.
    fn disk(&self, vm: u32, n: u32) -> String {
        format!("localhost:{}/disk.{n}", self.vm_dir(vm).display())
    }

    /// Run `KIND/drove/ACTION ARGS` with `stdin`, as the OpenNebula driver would.
    fn run(&self, kind: &str, action: &str, args: &[&str], stdin: Option<&str>) -> Output {
        self.run_env(kind, action, args, stdin, &[])
    }

    fn run_env(
        &self,
        kind: &str,
        action: &str,
        args: &[&str],
        stdin: Option<&str>,
        env: &[(&str, &str)],
    ) -> Output {
        let script = integ().join(kind).join("drove").join(action);
        let mut cmd = Command::new(&script);
        cmd.args(args)
            .env("DROVE", drove_bin())
            .env("DROVE_CLUSTER", &self.c.nodes[0].admin)
            .env("DROVE_CONF", &self.conf)
            .env_remove("ONE_LOCATION")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let o = child.wait_with_output().unwrap();
        eprintln!(
            "$ {kind}/drove/{action} {} -> {:?}\n{}",
            args.join(" "),
            o.status.code(),
            text(&o).trim_end()
        );
        o
    }

    /// Like [`One::run`]; the script must succeed. Returns its stdout.
    fn ok(&self, kind: &str, action: &str, args: &[&str], stdin: Option<&str>) -> String {
        let o = self.run(kind, action, args, stdin);
        assert!(
            o.status.success(),
            "{kind}/{action} {args:?} failed: {}",
            text(&o)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Like [`One::run`]; the script must fail and say `msg` on stderr, and change
    /// nothing in the cluster.
    fn fails(&self, kind: &str, action: &str, args: &[&str], stdin: Option<&str>, msg: &str) {
        let before = self.vdis();
        let o = self.run(kind, action, args, stdin);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{kind}/{action} {args:?} should fail");
        assert!(
            err.contains(msg),
            "{kind}/{action} {args:?}: stderr should say '{msg}': {err}"
        );
        assert_eq!(
            before,
            self.vdis(),
            "a failed {kind}/{action} changed the VDIs"
        );
    }

    /// `drove vdi list --json`: name -> record.
    fn vdis(&self) -> std::collections::BTreeMap<String, Value> {
        let o = self.c.drove(0, &["vdi", "list", "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| (x["name"].as_str().unwrap().to_string(), x.clone()))
            .collect()
    }

    fn names(&self) -> Vec<String> {
        self.vdis().into_keys().collect()
    }

    /// The name of `name`'s parent snapshot.
    fn parent(&self, name: &str) -> Option<String> {
        let all = self.vdis();
        let pid = all.get(name)?["parent"].as_u64()?;
        all.values()
            .find(|v| v["id"].as_u64() == Some(pid))
            .map(|v| v["name"].as_str().unwrap().to_string())
    }

    /// The marker `tm/drove` left for a disk: (DROVE_VDI, DROVE_NBD_URI).
    fn marker(&self, vm: u32, n: u32) -> Option<(String, String)> {
        let t = std::fs::read_to_string(self.vm_dir(vm).join(format!("disk.{n}.drove"))).ok()?;
        let get = |k: &str| {
            t.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_default()
                .to_string()
        };
        Some((get("DROVE_VDI"), get("DROVE_NBD_URI")))
    }
}

/// A 64 MiB raw image with `tag` at offset 0 and `tag2` at 5 MiB (another object).
fn make_image(dir: &Path, tag: &str, tag2: &str) -> PathBuf {
    let p = dir.join("image.raw");
    let mut data = vec![0u8; 6 << 20];
    data[..tag.len()].copy_from_slice(tag.as_bytes());
    data[5 << 20..(5 << 20) + tag2.len()].copy_from_slice(tag2.as_bytes());
    std::fs::write(&p, &data).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(64 << 20).unwrap();
    p
}

#[test]
fn test_opennebula_datastore_and_tm_scripts_as_opennebula_calls_them() {
    if !require(&["python3", "bash"]) {
        return;
    }
    let one = One::start();
    let img = make_image(one.tmp.path(), "OPENNEBULA-IMAGE", "SECOND-OBJECT");
    let img = img.to_str().unwrap();

    // ---- datastore: stat, cp, monitor -------------------------------------
    let out = one.ok(
        "datastore",
        "stat",
        &["5"],
        Some(&image_action(5, "", img, 0, "raw")),
    );
    assert_eq!(out, "64\n", "stat prints the size in MB");
    let out = one.ok(
        "datastore",
        "cp",
        &["5"],
        Some(&image_action(5, "", img, 64, "raw")),
    );
    assert_eq!(out, "drove:one-5 raw\n", "cp prints SOURCE FORMAT");
    let v = one.vdis();
    assert_eq!(v["one-5"]["size"], 64 << 20);
    assert_eq!(v.len(), 1, "{v:?}");
    one.fails(
        "datastore",
        "cp",
        &["5"],
        Some(&image_action(5, "", img, 64, "raw")),
        "already exists",
    );

    for (kind, sys) in [("datastore", false), ("tm", true)] {
        let out = one.ok(kind, "monitor", &["100"], Some(&monitor_action(100, sys)));
        let vals: std::collections::BTreeMap<&str, u64> = out
            .lines()
            .map(|l| {
                let (k, v) = l.split_once('=').expect("KEY=VALUE lines");
                (k, v.parse().expect("a number of MB"))
            })
            .collect();
        assert_eq!(
            vals.keys().copied().collect::<Vec<_>>(),
            ["FREE_MB", "TOTAL_MB", "USED_MB"],
            "{out}"
        );
        assert!(vals["FREE_MB"] > 0, "{out}");
        assert_eq!(vals["TOTAL_MB"], vals["USED_MB"] + vals["FREE_MB"], "{out}");
    }

    // ---- tm: clone (non-persistent), ln (persistent), mkimage (volatile) -----
    let out = one.ok(
        "tm",
        "clone",
        &["drove:one-5", &one.disk(12, 0), "12", "100"],
        None,
    );
    assert_eq!(out, "", "tm scripts print nothing on stdout");
    let base = one.parent("one-5-12-0").expect("the clone has a parent");
    assert!(base.starts_with("one-5.base-"), "{base}");
    assert_eq!(one.parent("one-5").as_deref(), Some(base.as_str()));
    assert!(!one.vdis()["one-5-12-0"]["ephemeral"]
        .as_bool()
        .unwrap_or(false));
    let (vdi, uri) = one.marker(12, 0).expect("clone writes disk.0.drove");
    assert_eq!(vdi, "one-5-12-0");
    assert_eq!(
        uri,
        format!("nbd+unix:///one-5-12-0?socket={}", one.c.nodes[0].nbd_unix)
    );
    // Again (OpenNebula retries a failed prolog): the clone is kept.
    one.ok(
        "tm",
        "clone",
        &["drove:one-5", &one.disk(12, 0), "12", "100"],
        None,
    );
    // A second VM: the same image snapshot, no new one.
    one.ok(
        "tm",
        "clone",
        &["drove:one-5", &one.disk(13, 0), "13", "100"],
        None,
    );
    assert_eq!(one.parent("one-5-13-0").as_deref(), Some(base.as_str()));
    let bases = one
        .names()
        .into_iter()
        .filter(|n| n.starts_with("one-5.base-"))
        .count();
    assert_eq!(bases, 1);

    let before = one.names();
    one.ok(
        "tm",
        "ln",
        &["drove:one-5", &one.disk(14, 0), "14", "100"],
        None,
    );
    assert_eq!(before, one.names(), "ln makes no VDI");
    assert_eq!(one.marker(14, 0).unwrap().0, "one-5");

    one.ok(
        "tm",
        "mkimage",
        &["32", "raw", &one.disk(12, 1), "12", "0"],
        None,
    );
    assert_eq!(one.vdis()["one-sys-12-1"]["size"], 32 << 20);
    assert_eq!(one.marker(12, 1).unwrap().0, "one-sys-12-1");

    // ---- tm: disk snapshots -----------------------------------------------
    one.ok(
        "tm",
        "snap_create",
        &[&one.disk(12, 0), "0", "12", "100"],
        None,
    );
    one.ok(
        "tm",
        "snap_create_live",
        &[&one.disk(12, 0), "1", "12", "100"],
        None,
    );
    assert_eq!(
        one.parent("one-5-12-0").as_deref(),
        Some("one-5-12-0.snap-1")
    );
    assert_eq!(
        one.parent("one-5-12-0.snap-1").as_deref(),
        Some("one-5-12-0.snap-0")
    );
    one.ok(
        "tm",
        "snap_revert",
        &[&one.disk(12, 0), "0", "12", "100"],
        None,
    );
    assert_eq!(
        one.parent("one-5-12-0").as_deref(),
        Some("one-5-12-0.snap-0")
    );
    one.ok(
        "tm",
        "snap_delete",
        &[&one.disk(12, 0), "1", "12", "100"],
        None,
    );
    assert!(!one.names().contains(&"one-5-12-0.snap-1".to_string()));
    // The disk reads from snap-0: deleting it flattens the disk first.
    one.ok(
        "tm",
        "snap_delete",
        &[&one.disk(12, 0), "0", "12", "100"],
        None,
    );
    assert!(!one.names().contains(&"one-5-12-0.snap-0".to_string()));
    assert_eq!(one.parent("one-5-12-0"), None, "flattened");
    one.ok(
        "tm",
        "resize",
        &[&one.disk(12, 0), "128", "12", "100"],
        None,
    );
    assert_eq!(one.vdis()["one-5-12-0"]["size"], 128 << 20);

    // ---- disk-saveas: datastore mkfs (save_as) then tm cpds ----------------
    let out = one.ok(
        "datastore",
        "mkfs",
        &["9"],
        Some(&image_action(9, "", "", 64, "save_as")),
    );
    assert_eq!(out, "drove:one-9\n");
    assert!(!one.names().contains(&"one-9".to_string()));
    one.ok(
        "tm",
        "cpds",
        &[&one.disk(13, 0), "drove:one-9", "-1", "13", "100"],
        None,
    );
    assert_eq!(one.parent("one-9"), None, "the saved image is independent");
    // An empty image (oneimage create --size 16).
    let out = one.ok(
        "datastore",
        "mkfs",
        &["10"],
        Some(&image_action(10, "", "", 16, "raw")),
    );
    assert_eq!(out, "drove:one-10\n");
    assert_eq!(one.vdis()["one-10"]["size"], 16 << 20);
    // oneimage clone of image 9 into image 11.
    let out = one.ok(
        "datastore",
        "clone",
        &["11"],
        Some(&image_action(11, "", "drove:one-9", 64, "raw")),
    );
    assert_eq!(out, "drove:one-11 raw\n");
    assert_eq!(one.parent("one-11"), None);

    // ---- bad input: a message on stderr, a non-zero exit, nothing changed ---
    let d = one.disk(15, 0);
    one.fails(
        "tm",
        "clone",
        &["drove:one-5", &d, "15"],
        None,
        "usage: clone",
    );
    one.fails(
        "tm",
        "clone",
        &["one-5", &d, "15", "100"],
        None,
        "not a drove image SOURCE",
    );
    one.fails(
        "tm",
        "clone",
        &[
            "drove:one-5",
            "/var/lib/one/datastores/0/15/disk.0",
            "15",
            "100",
        ],
        None,
        "is not HOST:PATH",
    );
    one.fails(
        "tm",
        "clone",
        &["drove:one-5", "localhost:/x/15/vda", "15", "100"],
        None,
        "not a VM disk path",
    );
    one.fails(
        "tm",
        "clone",
        &["drove:one-77", &d, "15", "100"],
        None,
        "one-77 does not exist",
    );
    one.fails(
        "tm",
        "clone",
        &["drove:one-5", &d, "vm15", "100"],
        None,
        "VMID must be",
    );
    one.fails(
        "tm",
        "clone",
        &["drove:bad/name", &d, "15", "100"],
        None,
        "not a valid drove VDI name",
    );
    one.fails(
        "tm",
        "snap_revert",
        &[&one.disk(12, 0), "7", "12", "100"],
        None,
        "does not exist",
    );
    one.fails(
        "tm",
        "snap_create",
        &[&one.disk(15, 0), "0", "15", "100"],
        None,
        "no drove VDI backs",
    );
    one.fails(
        "tm",
        "mkimage",
        &["0", "raw", &d, "15", "0"],
        None,
        "at least 1",
    );
    one.fails(
        "tm",
        "mkimage",
        &["16", "vmdk", &d, "15", "0"],
        None,
        "not supported",
    );
    one.fails(
        "tm",
        "cpds",
        &[&one.disk(13, 0), "drove:one-9", "-1", "13", "100"],
        None,
        "already exists",
    );
    one.fails(
        "tm",
        "delete",
        &["localhost:/var/lib/one/datastores/0", "15", "0"],
        None,
        "refusing to remove",
    );
    one.fails(
        "datastore",
        "cp",
        &["7"],
        Some("this is not base64!"),
        "bad DRIVER_ACTION",
    );
    one.fails(
        "datastore",
        "cp",
        &["7"],
        Some(&b64(b"<VM><ID>7</ID></VM>")),
        "expected <DS_DRIVER_ACTION_DATA>",
    );
    one.fails("datastore", "cp", &["7"], None, "no DRIVER_ACTION");
    one.fails(
        "datastore",
        "cp",
        &[],
        Some(&image_action(7, "", img, 64, "raw")),
        "usage: cp",
    );
    one.fails(
        "datastore",
        "cp",
        &["7"],
        Some(&image_action(7, "", "/nonexistent/disk.img", 64, "raw")),
        "does not exist",
    );
    one.fails(
        "datastore",
        "stat",
        &["7"],
        Some(&image_action(7, "", "/nonexistent/disk.img", 0, "raw")),
        "does not exist",
    );
    one.fails(
        "datastore",
        "rm",
        &["7"],
        Some(&image_action(7, "/var/lib/one/x", "", 64, "raw")),
        "not a drove image SOURCE",
    );
    one.fails(
        "datastore",
        "mkfs",
        &["7"],
        Some(&image_action(7, "", "", 0, "raw")),
        "at least 1 MB",
    );
    let o = one.run_env(
        "tm",
        "clone",
        &["drove:one-5", &d, "15", "100"],
        None,
        &[("DROVE_CLUSTER", "127.0.0.1:1")],
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Cannot reach the cluster"),
        "{}",
        text(&o)
    );
    let o = one.run_env(
        "tm",
        "ln",
        &["drove:one-5", &d, "15", "100"],
        None,
        &[("DROVE", "/nonexistent/drove")],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not installed"));

    // ---- a hypervisor that is not this host: the marker goes through ssh ------
    // (a stand-in ssh that logs its host and runs the remote command here).
    let ssh = one.tmp.path().join("fake-ssh");
    let ssh_log = one.tmp.path().join("fake-ssh.log");
    std::fs::write(
        &ssh,
        format!(
            "#!/bin/sh\necho \"$1\" >> {}\nshift\nexec \"$@\"\n",
            ssh_log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let remote = one.disk(16, 0).replacen("localhost:", "hv1:", 1);
    let via_ssh = [("DROVE_SSH", ssh.to_str().unwrap())];
    let o = one.run_env(
        "tm",
        "clone",
        &["drove:one-5", &remote, "16", "100"],
        None,
        &via_ssh,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(one.marker(16, 0).unwrap().0, "one-5-16-0");
    let o = one.run_env("tm", "delete", &[&remote, "16", "100"], None, &via_ssh);
    assert!(o.status.success(), "{}", text(&o));
    assert!(one.marker(16, 0).is_none());
    assert!(!one.names().contains(&"one-5-16-0".to_string()));
    let hosts = std::fs::read_to_string(&ssh_log).unwrap();
    assert!(
        !hosts.is_empty() && hosts.lines().all(|h| h == "hv1"),
        "{hosts}"
    );

    // ---- the end of the VMs: mvds, delete ----------------------------------
    one.ok(
        "tm",
        "mvds",
        &[&one.disk(14, 0), "drove:one-5", "14", "100"],
        None,
    );
    assert!(one.marker(14, 0).is_none(), "mvds removes the marker");
    one.ok("tm", "delete", &[&one.disk(14, 0), "14", "100"], None);
    assert!(
        one.names().contains(&"one-5".to_string()),
        "a persistent image stays"
    );
    one.ok("tm", "delete", &[&one.disk(12, 0), "12", "100"], None);
    one.ok("tm", "delete", &[&one.disk(12, 1), "12", "0"], None);
    let dir12 = format!("localhost:{}", one.vm_dir(12).display());
    one.ok("tm", "delete", &[&dir12, "12", "0"], None);
    assert!(!one.vm_dir(12).exists(), "delete of the VM directory");
    let names = one.names();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("one-5-12-0") || n == "one-sys-12-1"),
        "{names:?}"
    );
    // Again: already gone is not an error.
    one.ok("tm", "delete", &[&one.disk(12, 0), "12", "100"], None);

    // The image goes while VM 13 still runs on a clone of it: its snapshot stays
    // until that clone is deleted, then goes too.
    one.ok(
        "datastore",
        "rm",
        &["5"],
        Some(&image_action(5, "drove:one-5", img, 64, "raw")),
    );
    let names = one.names();
    assert!(!names.contains(&"one-5".to_string()));
    assert!(names.contains(&base), "{names:?}");
    one.ok("tm", "delete", &[&one.disk(13, 0), "13", "100"], None);
    for id in [9, 10, 11] {
        let src = format!("drove:one-{id}");
        one.ok(
            "datastore",
            "rm",
            &[&id.to_string()],
            Some(&image_action(id, &src, "", 64, "raw")),
        );
    }
    assert_eq!(
        one.names(),
        Vec::<String>::new(),
        "everything the drivers made is gone"
    );
}

/// A libvirt deployment file as OpenNebula's KVM driver writes it for VM `vm` with
/// one image disk of TYPE FILE.
fn deployment_xml(vm_dir: &Path, vm: u32) -> String {
    format!(
        "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\n\
         \t<name>one-{vm}</name>\n\t<uuid>0e7a3d5c-4f2b-4a7e-9c1d-5b0f9e2a{vm:04}</uuid>\n\
         \t<memory>262144</memory>\n\t<os><type arch='x86_64'>hvm</type></os>\n\t<devices>\n\
         \t\t<emulator><![CDATA[/usr/bin/qemu-system-x86_64]]></emulator>\n\
         \t\t<disk type='file' device='disk'>\n\
         \t\t\t<source file='{dir}/disk.0'/>\n\
         \t\t\t<target dev='vda' bus='virtio'/>\n\
         \t\t\t<boot order='1'/>\n\
         \t\t\t<driver name='qemu' type='raw' cache='none' io='native' discard='unmap'/>\n\
         \t\t</disk>\n\
         \t\t<disk type='file' device='cdrom'>\n\
         \t\t\t<source file='{dir}/disk.1'/>\n\
         \t\t\t<target dev='hda' bus='ide'/>\n\
         \t\t\t<readonly/>\n\
         \t\t\t<driver name='qemu' type='raw'/>\n\
         \t\t</disk>\n\
         \t</devices>\n\
         \t<qemu:commandline><qemu:arg value='-no-hpet'/></qemu:commandline>\n\
         </domain>\n",
        dir = vm_dir.display()
    )
}

/// The NBD URI of the first network disk of a filtered deployment file.
fn nbd_uri_of(xml: &str) -> String {
    let disk = xml
        .split("<disk ")
        .find(|d| d.starts_with("type=\"network\""))
        .unwrap_or_else(|| panic!("no network disk in:\n{xml}"));
    let attr = |s: &str, name: &str| {
        let k = format!("{name}=\"");
        let i = s.find(&k).unwrap_or_else(|| panic!("no {name} in {s}")) + k.len();
        s[i..i + s[i..].find('"').unwrap()].to_string()
    };
    let src = &disk[disk.find("<source ").unwrap()..];
    assert_eq!(attr(src, "protocol"), "nbd", "{disk}");
    let host = &src[src.find("<host ").unwrap()..];
    assert_eq!(attr(host, "transport"), "unix", "{disk}");
    format!(
        "nbd+unix:///{}?socket={}",
        attr(src, "name"),
        attr(host, "socket")
    )
}

/// DROVE_NBD_RECONNECT_DELAY in drove.conf reaches the filtered deployment file
/// through the marker: 0 leaves the reconnect out; a value that is not a number is
/// refused by tm clone and, in a marker, by the filter, each naming the variable.
fn assert_reconnect_delay_setting(one: &One, dep: &Path) {
    let conf = std::fs::read_to_string(&one.conf).unwrap();
    let filter = |delay: &str| {
        std::fs::write(
            &one.conf,
            format!("{conf}DROVE_NBD_RECONNECT_DELAY={delay}\n"),
        )
        .unwrap();
        one.run(
            "tm",
            "clone",
            &["drove:one-3", &one.disk(22, 0), "22", "100"],
            None,
        )
    };
    let o = filter("0");
    assert!(o.status.success(), "{}", text(&o));
    let dep22 = one.vm_dir(22).join("deployment.0");
    std::fs::write(&dep22, deployment_xml(&one.vm_dir(22), 22)).unwrap();
    let o = run(Command::new(integ().join("vmm/kvm/drove_deploy_filter")).arg(&dep22));
    assert!(o.status.success(), "{}", text(&o));
    let xml = std::fs::read_to_string(&dep22).unwrap();
    assert!(nbd_uri_of(&xml).ends_with(&format!("socket={}", one.c.nodes[0].nbd_unix)));
    assert!(!xml.contains("<reconnect"), "delay 0: no reconnect:\n{xml}");
    one.ok("tm", "delete", &[&one.disk(22, 0), "22", "100"], None);

    let o = filter("30s");
    assert!(!o.status.success(), "tm clone took a delay of '30s'");
    assert!(
        text(&o).contains("DROVE_NBD_RECONNECT_DELAY"),
        "{}",
        text(&o)
    );
    std::fs::write(&one.conf, &conf).unwrap();

    // A marker written by hand (or damaged) with a bad delay: the filter refuses it
    // and leaves the deployment file as it was.
    let marker = one.vm_dir(20).join("disk.0.drove");
    let good = std::fs::read_to_string(&marker).unwrap();
    std::fs::write(&marker, format!("{good}DROVE_NBD_RECONNECT_DELAY=-1\n")).unwrap();
    let before = std::fs::read_to_string(dep).unwrap();
    let fresh = one.vm_dir(20).join("deployment.bad");
    std::fs::write(&fresh, deployment_xml(&one.vm_dir(20), 20)).unwrap();
    let o = run(Command::new(integ().join("vmm/kvm/drove_deploy_filter")).arg(&fresh));
    assert!(!o.status.success(), "the filter took a delay of -1");
    assert!(
        text(&o).contains("DROVE_NBD_RECONNECT_DELAY"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(&fresh).unwrap(),
        deployment_xml(&one.vm_dir(20), 20)
    );
    std::fs::remove_file(&fresh).unwrap();
    std::fs::write(&marker, good).unwrap();
    assert_eq!(std::fs::read_to_string(dep).unwrap(), before);
}

#[test]
fn test_opennebula_vm_boots_from_a_disk_tm_clone_made() {
    let Some(kit) = require_ok(VmKit::find()) else {
        return;
    };
    if !require(&["python3", "qemu-img"]) {
        return;
    }
    let one = One::start();
    let img = make_image(one.tmp.path(), "DROVE-ONE-IMAGE-OK", "DROVE-ONE-SECOND-OK");
    let out = one.ok(
        "datastore",
        "cp",
        &["3"],
        Some(&image_action(3, "", img.to_str().unwrap(), 64, "raw")),
    );
    assert_eq!(out, "drove:one-3 raw\n");
    one.ok(
        "tm",
        "clone",
        &["drove:one-3", &one.disk(20, 0), "20", "100"],
        None,
    );

    // What the KVM driver's deploy does on the host, with the filter hooked in.
    let dep = one.vm_dir(20).join("deployment.0");
    std::fs::write(&dep, deployment_xml(&one.vm_dir(20), 20)).unwrap();
    let o = run(Command::new(integ().join("vmm/kvm/drove_deploy_filter")).arg(&dep));
    assert!(o.status.success(), "{}", text(&o));
    let xml = std::fs::read_to_string(&dep).unwrap();
    eprintln!("filtered deployment file:\n{xml}");
    assert!(xml.contains("xmlns:qemu="), "namespaces kept:\n{xml}");
    assert!(xml.contains("<qemu:commandline>"), "{xml}");
    assert!(
        xml.contains("type=\"file\" device=\"cdrom\""),
        "only drove disks change:\n{xml}"
    );
    let uri = nbd_uri_of(&xml);
    assert_eq!(uri, one.c.nodes[0].uri("one-3-20-0"));
    // QEMU holds the guest's I/O while the node restarts (drove.conf's default).
    assert!(
        xml.contains("<reconnect delay=\"30\" />"),
        "the disk source asks QEMU to reconnect:\n{xml}"
    );
    assert_reconnect_delay_setting(&one, &dep);

    let tmp = one.tmp.path();
    let script = kit.initramfs(
        &tmp.join("r"),
        "printf 'DROVE-READ0 '; head -c 18 /dev/vda; echo; \
         printf 'DROVE-READ1 '; dd if=/dev/vda bs=1048576 skip=5 count=1 2>/dev/null | head -c 19; echo; \
         printf 'GUEST-WROTE-THIS' | dd of=/dev/vda bs=4096 seek=4096 conv=notrunc 2>/dev/null; \
         sync; echo DROVE-GUEST-DONE",
    );
    let console = kit.boot(&script, &uri, Duration::from_secs(120));
    assert!(console.contains("DROVE-GUEST-DONE"), "{console}");
    assert!(
        console.contains("DROVE-READ0 DROVE-ONE-IMAGE-OK"),
        "the guest reads the imported image:\n{console}"
    );
    assert!(
        console.contains("DROVE-READ1 DROVE-ONE-SECOND-OK"),
        "{console}"
    );
    // The guest's write went to its clone, not to the image.
    let at = 4096 * 4096;
    for d in ["c", "i"] {
        std::fs::create_dir_all(tmp.join(d)).unwrap();
    }
    let clone = read_image(&uri, &tmp.join("c"), at + 16);
    assert_eq!(&clone[at..], b"GUEST-WROTE-THIS");
    let image = read_image(&one.c.nodes[1].uri("one-3"), &tmp.join("i"), at + 16);
    assert_eq!(&image[..18], b"DROVE-ONE-IMAGE-OK");
    assert!(
        image[at..].iter().all(|&b| b == 0),
        "the image is untouched"
    );

    // Ephemeral clones (DROVE_EPHEMERAL_CLONES=yes): drove deletes the disk when
    // the VM that wrote it goes away, and tm delete then finds nothing to do.
    one.configure(true);
    one.ok(
        "tm",
        "clone",
        &["drove:one-3", &one.disk(21, 0), "21", "100"],
        None,
    );
    let v = one.vdis();
    assert_eq!(v["one-3-21-0"]["ephemeral"], true, "{:?}", v["one-3-21-0"]);
    let (_, uri21) = one.marker(21, 0).unwrap();
    let console = kit.boot(&script, &uri21, Duration::from_secs(120));
    assert!(
        console.contains("DROVE-READ0 DROVE-ONE-IMAGE-OK"),
        "{console}"
    );
    wait_until(Duration::from_secs(30), "the ephemeral clone to go", || {
        !one.names().contains(&"one-3-21-0".to_string())
    });
    let o = one.run("tm", "delete", &[&one.disk(21, 0), "21", "100"], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(one.marker(21, 0).is_none());
    one.ok("tm", "delete", &[&one.disk(20, 0), "20", "100"], None);
    one.ok(
        "datastore",
        "rm",
        &["3"],
        Some(&image_action(3, "drove:one-3", "", 64, "raw")),
    );
    assert_eq!(one.names(), Vec::<String>::new());
}
