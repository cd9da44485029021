//! A real VM for tests: Debian's kernel and a busybox initramfs built here, booted
//! by QEMU under TCG with its virtio disk on an NBD URI. The guest's /init is a shell
//! script; what it prints on the serial console is what the test reads.
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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

    /// Boot with the disk at `uri`; returns everything the guest printed. Panics on
    /// a timeout.
    pub fn boot(&self, initrd: &Path, uri: &str, timeout: Duration) -> String {
        let mut child = Command::new("timeout")
            .arg(timeout.as_secs().to_string())
            .args([
                "qemu-system-x86_64",
                "-accel",
                "tcg",
                "-m",
                "256",
                "-nographic",
                "-no-reboot",
            ])
            .arg("-kernel")
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(initrd)
            .args(["-append", "console=ttyS0 panic=-1 quiet"])
            .args([
                "-drive",
                &format!("file={uri},format=raw,if=virtio,cache=none"),
            ])
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
