//! The Debian package, end to end: `packaging/deb/build.sh` packs the release binary
//! this test run was built with (nothing is rebuilt), `dpkg-deb` shows what is in
//! the package, `dpkg --root` installs it into a temporary root (never into this
//! machine's /: the maintainer scripts run chrootless with DPKG_ROOT set and make
//! the drove user in the temporary root's /etc/passwd), `systemd-analyze verify`
//! checks the installed units, then three nodes run as services and serve a disk.
//!
//! systemd is not PID 1 here (PID 1 is the sandbox's init; the test prints which),
//! so systemd cannot start the units. Instead this test is their supervisor: it
//! runs each node with the ExecStart line of the installed drove-node@.service
//! (`drove node run --config /etc/drove/node-%i.toml`, paths taken inside the
//! temporary root), as the unit's User= (the drove user postinst made), with its
//! UMask=, the StateDirectory= it would make, INVOCATION_ID set as systemd sets it,
//! and NOTIFY_SOCKET pointing at a datagram socket the test reads: a node counts as
//! started only once it has sent READY=1 (Type=notify), and a SIGTERM (systemctl
//! stop) must bring STOPPING=1 and a clean exit. What systemd alone would enforce
//! (ProtectSystem=, the system call filter, restart on failure) is not exercised:
//! `systemd-analyze verify` only checks that it parses.
mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's top directory.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `path` (absolute, as in a unit or a config file) inside the installed root.
fn inside(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The `[Service]` keys of a unit file (the last value of each key).
fn service_keys(unit: &str) -> BTreeMap<String, String> {
    let mut section = "";
    let mut keys = BTreeMap::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[Service]" && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                keys.insert(k.trim().to_string(), v.trim().to_string());
            }
        }
    }
    keys
}

/// The uid and gid of `user` in the installed root's passwd file.
fn ids(root: &Path, user: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    let line = passwd
        .lines()
        .find(|l| l.starts_with(&format!("{user}:")))
        .unwrap_or_else(|| panic!("no {user} in the root's /etc/passwd:\n{passwd}"));
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

/// One node run as a service by this test.
struct Service {
    name: String,
    child: Child,
    notify: UnixDatagram,
    log: PathBuf,
    admin: String,
    socket: PathBuf,
}

impl Service {
    /// The next notification the node sends, within `timeout`.
    fn notification(&self, timeout: Duration) -> Option<String> {
        self.notify.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 4096];
        let n = self.notify.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_deb_installs_and_its_units_run_a_three_node_cluster() {
    if !require(&[
        "dpkg-deb",
        "dpkg",
        "dpkg-query",
        "dpkg-shlibdeps",
        "objcopy",
        "gzip",
        "useradd",
        "groupadd",
        "systemd-analyze",
        "qemu-io",
    ]) {
        return;
    }
    if !is_root() {
        skip("installing with the drove user's ownership and running nodes as it need root");
        return;
    }
    let pid1 = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    eprintln!(
        "PID 1 is {:?}: {}",
        pid1.trim(),
        if pid1.trim() == "systemd" {
            "systemd runs here, but this test leaves the real system alone and supervises the units itself"
        } else {
            "not systemd, so this test supervises the units' ExecStart itself"
        }
    );
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    // The drove user must reach the installed root through this directory.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    // 1. Build the package from the binary under test. gzip: xz (make deb's default)
    // takes about 20 s more on 2 busy cores and tests nothing more.
    let out = tmp.path().join("out");
    let t = Instant::now();
    let o = run(Command::new("bash")
        .arg(repo().join("packaging/deb/build.sh"))
        .env("DROVE_BIN", drove_bin())
        .env("DEB_OUT", &out)
        .env("DEB_COMPRESS", "gzip"));
    assert!(o.status.success(), "build.sh failed: {}", text(&o));
    let deb = PathBuf::from(String::from_utf8_lossy(&o.stdout).lines().last().unwrap());
    let arch = String::from_utf8(run(Command::new("dpkg").arg("--print-architecture")).stdout)
        .unwrap()
        .trim()
        .to_string();
    let version = format!("{}-1", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        deb,
        out.join(format!("drove_{version}_{arch}.deb")),
        "the .deb's name"
    );
    eprintln!(
        "built {} ({} bytes) in {:.1} s",
        deb.display(),
        std::fs::metadata(&deb).unwrap().len(),
        t.elapsed().as_secs_f64()
    );

    // 2. What is in it.
    let o = run(Command::new("dpkg-deb").arg("--info").arg(&deb));
    assert!(o.status.success(), "dpkg-deb --info: {}", text(&o));
    let info = text(&o);
    for want in [
        "Package: drove".to_string(),
        format!("Version: {version}"),
        format!("Architecture: {arch}"),
        "Depends: libc6 (>= ".to_string(),
        "Recommends: qemu-utils".to_string(),
        " conffiles".to_string(),
        " postinst".to_string(),
        " prerm".to_string(),
        " postrm".to_string(),
    ] {
        assert!(
            info.contains(&want),
            "no {want:?} in dpkg-deb --info:\n{info}"
        );
    }
    let o = run(Command::new("dpkg-deb")
        .args(["--info"])
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "/etc/drove/node.toml"
    );
    let o = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    assert!(o.status.success(), "dpkg-deb --contents: {}", text(&o));
    let contents = String::from_utf8_lossy(&o.stdout).into_owned();
    for want in [
        "./usr/bin/drove",
        "./lib/systemd/system/drove-node.service",
        "./lib/systemd/system/drove-node@.service",
        "./etc/drove/node.toml",
        "./usr/share/man/man1/drove.1.gz",
        "./usr/share/man/man1/drove-node-run.1.gz",
        "./usr/share/man/man1/drove-vdi-create.1.gz",
        "./usr/share/bash-completion/completions/drove",
        "./usr/share/zsh/vendor-completions/_drove",
        "./usr/share/doc/drove/copyright",
        "./usr/share/doc/drove/install.md.gz",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(&format!(" {want}"))),
            "no {want} in the package:\n{contents}"
        );
    }
    assert!(
        contents.lines().all(|l| l.contains(" root/root ")),
        "every file belongs to root:\n{contents}"
    );
    let man_pages = contents.lines().filter(|l| l.ends_with(".1.gz")).count();
    eprintln!("{man_pages} man pages in the package");

    // 3. Install it into a temporary root: an empty dpkg database, and a passwd and
    // group file with root only, for postinst's useradd --prefix.
    let root = tmp.path().join("root");
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "etc"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dpkg = |args: &[&str]| {
        run(Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--force-not-root", "--force-script-chrootless"])
            .args(args))
    };
    // --force-depends: the empty root has no libc6 package (the binary uses the
    // host's libc through the host's loader).
    let o = dpkg(&["--force-depends", "-i", deb.to_str().unwrap()]);
    assert!(o.status.success(), "dpkg -i: {}", text(&o));
    let o = run(Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            root.join("var/lib/dpkg").display()
        ))
        .args(["-W", "-f=${Status} ${Version} ${Conffiles}", "drove"]));
    let status = text(&o);
    assert!(
        status.starts_with(&format!("install ok installed {version}"))
            && status.contains("/etc/drove/node.toml"),
        "dpkg-query: {status}"
    );
    let (uid, gid) = ids(&root, "drove");
    assert!(uid > 0 && uid < 1000, "drove is a system user: uid {uid}");
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
    assert!(group.contains(&format!("drove:x:{gid}:")), "{group}");
    for d in ["var/lib/drove", "var/log/drove"] {
        let m = std::fs::metadata(root.join(d)).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o7777),
            (uid, gid, 0o750),
            "{d}"
        );
    }
    assert!(
        !std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .contains("drove node"),
        "postinst must not touch this machine's /etc/passwd"
    );
    let bin = inside(&root, "/usr/bin/drove");
    let o = run(Command::new(&bin).arg("--version"));
    assert!(text(&o).contains(env!("CARGO_PKG_VERSION")), "{}", text(&o));

    // Man pages and completions are real.
    let o = run(Command::new("gzip")
        .arg("-dc")
        .arg(inside(&root, "/usr/share/man/man1/drove-node-run.1.gz")));
    let man = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        man.contains(".TH drove-node-run 1") && man.contains("config"),
        "{man}"
    );
    let bash = inside(&root, "/usr/share/bash-completion/completions/drove");
    let o = run(Command::new("bash").arg("-n").arg(&bash));
    assert!(o.status.success(), "bash -n: {}", text(&o));
    assert!(std::fs::read_to_string(&bash)
        .unwrap()
        .contains("complete -F"));
    let zsh =
        std::fs::read_to_string(inside(&root, "/usr/share/zsh/vendor-completions/_drove")).unwrap();
    assert!(
        zsh.starts_with("#compdef drove"),
        "{}",
        &zsh[..80.min(zsh.len())]
    );

    // 4. The units: the template is the single unit with %i in three places only, and
    // systemd-analyze finds nothing to say about either (it needs the targets they
    // name: the host's are copied into the root).
    let units = inside(&root, "/lib/systemd/system");
    let single = std::fs::read_to_string(units.join("drove-node.service")).unwrap();
    let template = std::fs::read_to_string(units.join("drove-node@.service")).unwrap();
    let mut want = service_keys(&single);
    want.insert(
        "ExecStart".into(),
        "/usr/bin/drove node run --config /etc/drove/node-%i.toml".into(),
    );
    want.insert("StateDirectory".into(), "drove/%i".into());
    let keys = service_keys(&template);
    assert_eq!(
        keys, want,
        "drove-node@.service drifted from drove-node.service"
    );
    for (k, v) in [
        ("Type", "notify"),
        ("User", "drove"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("Restart", "on-failure"),
        ("ReadWritePaths", "/var/lib/drove"),
    ] {
        assert_eq!(keys.get(k).map(String::as_str), Some(v), "{k}=");
    }
    assert_eq!(
        service_keys(&single)["ExecStart"],
        "/usr/bin/drove node run --config /etc/drove/node.toml"
    );
    for entry in std::fs::read_dir("/lib/systemd/system").unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if (name.ends_with(".target") || name.ends_with(".slice")) && p.is_file() {
            std::fs::copy(&p, units.join(&name)).unwrap();
        }
    }
    for unit in ["drove-node.service", "drove-node@n1.service"] {
        let o = run(Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(format!("--root={}", root.display()))
            .arg(unit));
        assert!(
            o.status.success() && text(&o).trim().is_empty(),
            "systemd-analyze verify {unit}: {}",
            text(&o)
        );
    }
    eprintln!("systemd-analyze verify: both units clean");

    // 5. Three nodes, each drove-node@nI with /etc/drove/node-nI.toml: a copy of the
    // installed node.toml with its data directory, ports, zone and join set.
    let exec: Vec<String> = keys["ExecStart"]
        .split_whitespace()
        .map(String::from)
        .collect();
    let umask = u32::from_str_radix(&keys["UMask"], 8).unwrap();
    assert_eq!(ids(&root, &keys["User"]), (uid, gid));
    let shipped = std::fs::read_to_string(inside(&root, "/etc/drove/node.toml")).unwrap();
    assert!(
        shipped.contains("\ndata = \"/var/lib/drove\"\n"),
        "{shipped}"
    );
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut nodes: Vec<Service> = Vec::new();
    for i in 1..=3 {
        let name = format!("n{i}");
        let argv: Vec<String> = exec.iter().map(|a| a.replace("%i", &name)).collect();
        let config_at = argv
            .iter()
            .position(|a| a == "--config")
            .expect("--config in ExecStart");
        let config = inside(&root, &argv[config_at + 1]);
        // StateDirectory=drove/%i: systemd makes it, owned by User=.
        let state = format!("/var/lib/{}", keys["StateDirectory"].replace("%i", &name));
        let data = inside(&root, &state);
        std::fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::chown(&data, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o750)).unwrap();
        let admin = format!("127.0.0.1:{}", free_port());
        let mut toml = shipped.replace(
            "\ndata = \"/var/lib/drove\"\n",
            &format!("\ndata = \"{}\"\n", data.display()),
        );
        toml.push_str(&format!(
            "zone = \"z{i}\"\nlisten = \"{admin}\"\npeer_listen = \"127.0.0.1:{}\"\n\
             nbd_listen = \"127.0.0.1:{}\"\n",
            free_port(),
            free_port()
        ));
        if i > 1 {
            toml.push_str(&format!(
                "join = \"{}\"\njoin_timeout = 30\n",
                nodes[0].admin
            ));
        }
        if i == 3 {
            // With a log file too: under systemd stderr (the journal) still gets it all.
            let f = inside(&root, "/var/log/drove/n3.log");
            toml.push_str(&format!("log_file = \"{}\"\n", f.display()));
        }
        std::fs::write(&config, toml).unwrap();
        let notify_path = tmp.path().join(format!("notify-{name}.sock"));
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        // Like systemd's own notify socket, anyone may send to it.
        std::fs::set_permissions(&notify_path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let log = logs.join(format!("{name}.stderr"));
        let out_file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(inside(&root, &argv[0]));
        cmd.args(&argv[1..config_at + 1])
            .arg(&config)
            .args(&argv[config_at + 2..])
            .env("NOTIFY_SOCKET", &notify_path)
            .env("INVOCATION_ID", format!("{:032x}", 0xd20e_u128 + i))
            .env_remove("RUST_LOG")
            .current_dir("/")
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .stdout(out_file.try_clone().unwrap())
            .stderr(out_file);
        // SAFETY: umask is async-signal-safe and touches nothing but the child's mask.
        unsafe {
            cmd.pre_exec(move || {
                let _ = rustix::process::umask(rustix::fs::Mode::from_raw_mode(umask));
                Ok(())
            });
        }
        let t = Instant::now();
        let child = cmd.spawn().expect("start the node");
        let node = Service {
            name,
            child,
            notify,
            log,
            admin,
            socket: data.join("nbd.sock"),
        };
        // Type=notify: started once READY=1 came (TimeoutStartSec is far longer).
        let msg = node
            .notification(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("no READY=1 from {}: {}", node.name, node.log_text()));
        assert!(msg.starts_with("READY=1\n"), "{}: {msg:?}", node.name);
        eprintln!(
            "{}: {:?} {:.1} s after start",
            node.name,
            msg,
            t.elapsed().as_secs_f64()
        );
        nodes.push(node);
    }

    // 6. The nodes run as the drove user with the unit's umask, and log as services.
    for n in &nodes {
        let st = std::fs::read_to_string(format!("/proc/{}/status", n.child.id())).unwrap();
        let uid_line = st.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid_line
                .split_whitespace()
                .skip(1)
                .all(|u| u == uid.to_string()),
            "{}: {uid_line}",
            n.name
        );
        // drove's own modes, whatever the unit's umask: the drove group may reach
        // the socket and nothing else.
        let m = std::fs::metadata(&n.socket).unwrap();
        assert_eq!(
            (m.mode() & 0o777, m.gid()),
            (0o660, gid),
            "{}: nbd.sock",
            n.name
        );
        let d = std::fs::metadata(n.socket.parent().unwrap()).unwrap();
        assert_eq!(
            (d.mode() & 0o777, d.gid()),
            (0o710, gid),
            "{}: data dir",
            n.name
        );
        assert!(
            n.log_text().contains("node ready"),
            "{}: {}",
            n.name,
            n.log_text()
        );
    }
    let n3_file = std::fs::read_to_string(inside(&root, "/var/log/drove/n3.log")).unwrap();
    assert!(n3_file.contains("node ready"), "n3.log: {n3_file}");

    // 7. A disk, with the installed binary: written through node 1, read through
    // nodes 2 and 3.
    let drove = |args: &[&str]| {
        let o = run(Command::new(&bin)
            .args(args)
            .args(["--cluster", &nodes[0].admin]));
        assert!(o.status.success(), "drove {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let members = drove(&["node", "list", "--json"]);
    let members: serde_json::Value = serde_json::from_str(&members).unwrap();
    assert_eq!(
        members["nodes"].as_object().map(|m| m.len()),
        Some(3),
        "{members}"
    );
    drove(&["vdi", "create", "vm1", "64M"]);
    let uri = |n: &Service| format!("nbd+unix:///vm1?socket={}", n.socket.display());
    let t = Instant::now();
    qemu_io(
        &uri(&nodes[0]),
        &[
            "write -P 0x5a 0 4M".into(),
            "write -P 0xa5 40M 1M".into(),
            "flush".into(),
        ],
    );
    for n in &nodes[1..] {
        qemu_io(
            &uri(n),
            &["read -P 0x5a 0 4M".into(), "read -P 0xa5 40M 1M".into()],
        );
    }
    eprintln!(
        "vm1: 5 MiB written through n1, read back through n2 and n3 in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // 8. systemctl stop: SIGTERM, STOPPING=1, a clean exit.
    for n in nodes.iter_mut().rev() {
        signal(n.child.id(), Signal::TERM);
        let msg = n.notification(Duration::from_secs(30));
        assert_eq!(msg.as_deref(), Some("STOPPING=1"), "{}", n.name);
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = n.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < end, "{} did not stop on SIGTERM", n.name);
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{}: {status}: {}", n.name, n.log_text());
    }

    // 9. Purge: the conffile and the log directory go, the node data stays.
    let o = dpkg(&["--purge", "drove"]);
    assert!(o.status.success(), "dpkg --purge: {}", text(&o));
    assert!(!inside(&root, "/usr/bin/drove").exists());
    assert!(!inside(&root, "/etc/drove/node.toml").exists());
    assert!(!inside(&root, "/var/log/drove").exists());
    assert!(inside(&root, "/var/lib/drove/n1").exists());
    eprintln!("the whole test: {:.1} s", started.elapsed().as_secs_f64());
}
