//! A real VM for tests: Debian's kernel and a busybox initramfs built here, booted
//! by QEMU under TCG with its virtio disk on an NBD URI. The guest's /init is a shell
//! script; what it prints on the serial console is what the test reads.
//!
//! Two ways to run it: [`VmKit::boot`] runs a VM to completion and returns its console;
//! [`VmKit::start`] returns a running [`Vm`] driven over QMP (pause, migrate, quit)
//! whose console is logged to a file and whose console input the test can type into.
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

/// Kernel, modules and tools for a VM, or the reason a test cannot run one.
pub struct VmKit {
    pub kernel: PathBuf,
    modules: Vec<PathBuf>,
}

impl VmKit {
    /// Find the kernel and the modules the guest needs (virtio block + ext4 and all
    /// their dependencies, in load order). `Err(reason)` when anything is missing.
    pub fn find() -> Result<VmKit, String> {
        for tool in ["qemu-system-x86_64", "cpio", "busybox"] {
            if !super::on_path(tool) {
                return Err(format!("{tool} is not installed"));
            }
        }
        let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
            .map_err(|e| format!("/boot: {e}"))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
            .collect();
        kernels.sort();
        let kernel = kernels
            .pop()
            .ok_or("no /boot/vmlinuz-* (apt-get install linux-image-amd64)")?;
        let kver = kernel.file_name().unwrap().to_string_lossy()["vmlinuz-".len()..].to_string();
        let moddir = PathBuf::from(format!("/lib/modules/{kver}"));
        let dep = std::fs::read_to_string(moddir.join("modules.dep"))
            .map_err(|e| format!("{}/modules.dep: {e}", moddir.display()))?;
        let deps: HashMap<String, Vec<String>> = dep
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(m, d)| {
                (
                    m.to_string(),
                    d.split_whitespace().map(str::to_string).collect(),
                )
            })
            .collect();
        let by_name = |name: &str| {
            deps.keys()
                .find(|k| {
                    let f = Path::new(k.as_str())
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .to_string();
                    f == format!("{name}.ko")
                })
                .cloned()
        };
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        fn visit(
            m: &str,
            deps: &HashMap<String, Vec<String>>,
            seen: &mut BTreeSet<String>,
            order: &mut Vec<String>,
        ) {
            if !seen.insert(m.to_string()) {
                return;
            }
            for d in deps.get(m).into_iter().flatten() {
                visit(d, deps, seen, order);
            }
            order.push(m.to_string());
        }
        // crc32c_generic: ext4 asks the crypto API for crc32c by name at mount time.
        for name in ["virtio_pci", "virtio_blk", "crc32c_generic", "ext4"] {
            let m = by_name(name).ok_or(format!(
                "module {name}.ko not found (compressed modules are not supported)"
            ))?;
            visit(&m, &deps, &mut seen, &mut order);
        }
        Ok(VmKit {
            kernel,
            modules: order.into_iter().map(|m| moddir.join(m)).collect(),
        })
    }

    /// Build an initramfs in `dir` whose /init runs `script` (busybox sh) after the
    /// modules are loaded and /dev/vda is there, then powers off.
    pub fn initramfs(&self, dir: &Path, script: &str) -> PathBuf {
        let root = dir.join("root");
        for d in ["bin", "proc", "sys", "dev", "tmp", "mnt", "modules"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        let mut names = Vec::new();
        for (i, m) in self.modules.iter().enumerate() {
            let name = format!("{i:02}-{}", m.file_name().unwrap().to_string_lossy());
            std::fs::copy(m, root.join("modules").join(&name)).unwrap();
            names.push(name);
        }
        let init = format!(
            "#!/bin/busybox sh\n/bin/busybox --install -s /bin\n\
             mount -t proc proc /proc\nmount -t sysfs sys /sys\nmount -t devtmpfs dev /dev\nmount -t tmpfs tmp /tmp\n\
             for m in {}; do insmod /modules/$m; done\n\
             i=0; while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done\n\
             {script}\nsync\npoweroff -f\n",
            names.join(" ")
        );
        let init_path = root.join("init");
        std::fs::write(&init_path, init).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&init_path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = dir.join("initrd.cpio");
        let status = Command::new("sh")
            .current_dir(&root)
            .args([
                "-c",
                &format!("find . | cpio -o -H newc --quiet > {}", out.display()),
            ])
            .status()
            .unwrap();
        assert!(status.success(), "cpio failed");
        out
    }

    /// The kernel, the initramfs and the disk given by its `-drive` option,
    /// powering off instead of rebooting.
    fn guest_args_drive(&self, initrd: &Path, drive: &str) -> Vec<std::ffi::OsString> {
        self.guest_args_disk(initrd, &["-drive".to_string(), drive.to_string()])
    }

    /// [`VmKit::guest_args_drive`] with the disk's QEMU arguments given whole
    /// (`-blockdev ... -device virtio-blk-pci,...`).
    fn guest_args_disk(&self, initrd: &Path, disk: &[String]) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = vec!["-no-reboot".into(), "-kernel".into()];
        a.push(self.kernel.clone().into_os_string());
        a.push("-initrd".into());
        a.push(initrd.as_os_str().to_owned());
        a.push("-append".into());
        a.push("console=ttyS0 panic=-1 quiet".into());
        a.extend(disk.iter().map(Into::into));
        a
    }

    /// Boot with the disk at `uri`; returns everything the guest printed. Panics on
    /// a timeout.
    pub fn boot(&self, initrd: &Path, uri: &str, timeout: Duration) -> String {
        let drive = format!("file={uri},format=raw,if=virtio,cache=none");
        self.boot_drive(initrd, &drive, &[], timeout)
    }

    /// [`VmKit::boot`] with the `-drive` option given whole and more QEMU arguments
    /// (`-object tls-creds-x509,...` for a disk over NBD with TLS).
    pub fn boot_drive(
        &self,
        initrd: &Path,
        drive: &str,
        extra: &[String],
        timeout: Duration,
    ) -> String {
        let mut child = Command::new("timeout")
            .arg(timeout.as_secs().to_string())
            .args([
                "qemu-system-x86_64",
                "-accel",
                "tcg",
                "-m",
                "256",
                "-nographic",
            ])
            .args(extra)
            .args(self.guest_args_drive(initrd, drive))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu-system-x86_64");
        let out = std::mem::take(&mut child.stdout);
        let mut text = String::new();
        if let Some(mut o) = out {
            use std::io::Read;
            let mut buf = Vec::new();
            let _ = o.read_to_end(&mut buf);
            text = String::from_utf8_lossy(&buf).into_owned();
        }
        let status = child.wait().unwrap();
        assert!(
            status.code() != Some(124),
            "VM did not power off within {timeout:?}:\n{text}"
        );
        text
    }
}

/// Whether a started VM boots or waits for an incoming migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Boot the kernel at once.
    Boot,
    /// Stay paused (`-S`) and wait for a migration stream (`-incoming defer`); call
    /// [`Vm::listen_for_migration`] to open the port.
    Incoming,
}

impl VmKit {
    /// Start QEMU with its disk at `uri`, keeping its files in `dir` (`console.log`,
    /// `qemu.err`, `qmp.sock`). Source and destination of a migration must be started
    /// with the same `initrd` and `uri` form: QEMU requires identical device setups.
    pub fn start(&self, initrd: &Path, uri: &str, dir: &Path, start: Start) -> Vm {
        let drive = format!("file={uri},format=raw,if=virtio,cache=none");
        self.start_disk(initrd, &["-drive".to_string(), drive], dir, start)
    }

    /// [`VmKit::start`] with the disk's QEMU arguments given whole (`-blockdev
    /// driver=nbd,... -device virtio-blk-pci,drive=...`).
    pub fn start_disk(&self, initrd: &Path, disk: &[String], dir: &Path, start: Start) -> Vm {
        std::fs::create_dir_all(dir).unwrap();
        let console_log = dir.join("console.log");
        let qmp_sock = dir.join("qmp.sock");
        let mut cmd = Command::new("qemu-system-x86_64");
        // -nodefaults: no NIC or VGA to probe; the serial port is the only console.
        cmd.args([
            "-accel",
            "tcg",
            "-m",
            "256",
            "-nodefaults",
            "-display",
            "none",
        ])
        .args(self.guest_args_disk(initrd, disk))
        .args(["-serial", "stdio"])
        .args([
            "-qmp",
            &format!("unix:{},server=on,wait=off", qmp_sock.display()),
        ]);
        if start == Start::Incoming {
            cmd.args(["-S", "-incoming", "defer"]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(File::create(&console_log).unwrap())
            .stderr(File::create(dir.join("qemu.err")).unwrap())
            .spawn()
            .expect("qemu-system-x86_64");
        let console_in = child.stdin.take().unwrap();
        let qmp = Qmp::connect(&qmp_sock, Duration::from_secs(30));
        Vm {
            child,
            console_in,
            console_log,
            dir: dir.to_path_buf(),
            qmp,
        }
    }
}

/// A running QEMU; killed when dropped.
pub struct Vm {
    child: Child,
    /// The serial console's input (QEMU's stdin): what is written here the guest
    /// reads from /dev/ttyS0. Kept open for the VM's life, so QEMU never sees EOF.
    console_in: ChildStdin,
    console_log: PathBuf,
    dir: PathBuf,
    /// The VM's QMP monitor.
    pub qmp: Qmp,
}

impl Vm {
    /// Everything the guest printed on its serial console so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console_log).unwrap_or_default()).into_owned()
    }

    /// The file the serial console is logged to.
    pub fn console_path(&self) -> &Path {
        &self.console_log
    }

    /// What QEMU itself printed on stderr (errors, warnings).
    pub fn qemu_errors(&self) -> String {
        std::fs::read_to_string(self.dir.join("qemu.err")).unwrap_or_default()
    }

    /// Type `line` and Enter on the serial console.
    pub fn type_line(&mut self, line: &str) {
        writeln!(self.console_in, "{line}").unwrap();
        self.console_in.flush().unwrap();
    }

    /// QEMU's run state (`running`, `paused`, `inmigrate`, `postmigrate`, ...).
    pub fn status(&mut self) -> String {
        let r = self.qmp.execute("query-status", json!({})).unwrap();
        r["status"].as_str().unwrap_or_default().to_string()
    }

    /// On a VM started with [`Start::Incoming`]: listen for the migration stream on
    /// a free port of 127.0.0.1 (QEMU picks it, so there is no race for the port).
    pub fn listen_for_migration(&mut self) -> u16 {
        let uri = json!({"uri": "tcp:127.0.0.1:0"});
        self.qmp.execute("migrate-incoming", uri).unwrap();
        let info = self.qmp.execute("query-migrate", json!({})).unwrap();
        let port = &info["socket-address"][0]["port"];
        port.as_str()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no listening port in {info}"))
    }

    /// Migrate to the VM listening on `port` and wait until the migration completed
    /// (this VM is then paused in `postmigrate`). Panics if it fails or takes longer
    /// than `timeout`.
    pub fn migrate_to(&mut self, port: u16, timeout: Duration) {
        let uri = json!({"uri": format!("tcp:127.0.0.1:{port}")});
        self.qmp.execute("migrate", uri).unwrap();
        super::wait_until(timeout, "the migration to complete", || {
            let info = self.qmp.execute("query-migrate", json!({})).unwrap();
            let status = info["status"].as_str().unwrap_or_default();
            assert!(
                !matches!(status, "failed" | "cancelled"),
                "migration {status}: {info}"
            );
            status == "completed"
        });
    }

    /// Wait until QEMU exits (the guest powered off, or `quit`).
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut status = None;
        super::wait_until(timeout, "QEMU to exit", || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap()
    }

    /// Stop QEMU through QMP and wait for it to exit.
    pub fn quit(&mut self) {
        // QEMU may close the socket before its reply arrives: the exit is what counts.
        let _ = self.qmp.execute("quit", json!({}));
        self.wait_exit(Duration::from_secs(30));
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A QMP client: one JSON object per line over QEMU's monitor socket.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connect to the socket at `path` (QEMU creates it shortly after it starts),
    /// read the greeting and leave capabilities negotiation mode.
    pub fn connect(path: &Path, timeout: Duration) -> Qmp {
        let mut stream = None;
        super::wait_until(timeout, "QEMU's QMP socket", || {
            stream = UnixStream::connect(path).ok();
            stream.is_some()
        });
        let writer = stream.unwrap();
        // A QEMU that hangs must fail the test, not block it forever.
        writer
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        let mut qmp = Qmp { reader, writer };
        let greeting = qmp.read_message().expect("QMP greeting");
        assert!(
            greeting.get("QMP").is_some(),
            "not a QMP greeting: {greeting}"
        );
        qmp.execute("qmp_capabilities", json!({})).unwrap();
        qmp
    }

    /// Run `command` with `arguments`: its `return` value, or its `error` as text.
    /// Asynchronous events that arrive before the reply are skipped.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let request = json!({"execute": command, "arguments": arguments});
        writeln!(self.writer, "{request}").map_err(|e| format!("QMP write: {e}"))?;
        loop {
            let Some(message) = self.read_message() else {
                return Err(format!("QMP closed before the reply to {command}"));
            };
            if let Some(value) = message.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = message.get("error") {
                return Err(format!("{command}: {error}"));
            }
        }
    }

    /// The next message, or None when QEMU closed the connection.
    fn read_message(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("bad QMP line {line:?}: {e}")),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("QMP read: {e}"),
        }
    }
}
