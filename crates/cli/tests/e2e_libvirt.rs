//! libvirt for real: libvirtd (Debian's libvirt-daemon-system) runs a TCG domain
//! whose disk is `<disk type='network'>` with an NBD source on a drove node, the XML
//! docs/qemu-libvirt.md shows. The guest reads what the host wrote through drove and
//! writes its answer to its disk; the host reads the answer back through another
//! node once the domain has shut off. No serial console is needed: the disk carries
//! both ways, so the check does not depend on how libvirt logs consoles.
mod common;
use common::vm::VmKit;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const MARK: &str = "DROVE-LIBVIRT-MARK-1";

/// A libvirtd (and its virtlogd) started for the test when none answers already;
/// stopped when dropped.
struct Libvirtd {
    started: Vec<Child>,
}

impl Libvirtd {
    fn answers() -> bool {
        Command::new("virsh")
            .args(["-c", "qemu:///system", "version"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn ensure() -> Libvirtd {
        let mut started = Vec::new();
        if !Self::answers() {
            for daemon in ["virtlogd", "libvirtd"] {
                let c = Command::new(daemon)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot start {daemon}: {e}"));
                started.push(c);
            }
            wait_until(Duration::from_secs(60), "libvirtd to answer", Self::answers);
        }
        Libvirtd { started }
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        for c in self.started.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn virsh(args: &[&str]) -> std::process::Output {
    run(Command::new("virsh")
        .args(["-c", "qemu:///system"])
        .args(args)
        .stdin(Stdio::null()))
}

/// The domain: TCG, direct kernel boot, the drove disk over NBD on TCP.
fn domain_xml(
    name: &str,
    kernel: &Path,
    initrd: &Path,
    host: &str,
    port: &str,
    vdi: &str,
) -> String {
    format!(
        r#"<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='network' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source protocol='nbd' name='{vdi}'>
        <host name='{host}' port='{port}'/>
      </source>
      <target dev='vda' bus='virtio'/>
    </disk>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
</domain>
"#,
        kernel = kernel.display(),
        initrd = initrd.display(),
    )
}

#[test]
fn test_libvirt_domain_with_an_nbd_network_disk_on_drove_reads_and_writes_it() {
    let Some(kit) = require_ok(VmKit::find()) else {
        return;
    };
    if !require(&["virsh", "libvirtd", "virtlogd", "qemu-io", "qemu-img"]) {
        return;
    }
    let c = Cluster::start(2, 2);
    c.create_vdi("lvdisk", "64M", &["--copies", "2"]);
    // The host writes a mark at offset 0 through node 1.
    let tmp = tempfile::tempdir().unwrap();
    // libvirt runs QEMU as its own user: the kernel and initrd must be reachable.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mark = tmp.path().join("mark");
    std::fs::write(&mark, MARK).unwrap();
    let o = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        &format!("write -s {} 0 {}", mark.display(), MARK.len()),
        &c.nodes[0].tcp_uri("lvdisk"),
    ]));
    assert!(
        o.status.success() && !text(&o).contains("failed"),
        "{}",
        text(&o)
    );

    // The guest copies the mark to 1 MiB and adds its own word, durably.
    let initrd = kit.initramfs(
        &tmp.path().join("vm"),
        &format!(
            "m=$(dd if=/dev/vda bs={n} count=1 2>/dev/null); \
             echo \"$m GUEST-OK\" | dd of=/dev/vda bs=512 seek=2048 conv=fsync 2>/dev/null",
            n = MARK.len()
        ),
    );
    std::fs::set_permissions(
        tmp.path().join("vm"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let tcp = c.nodes[0].nbd_tcp.trim_start_matches("nbd://").to_string();
    let (host, port) = tcp.rsplit_once(':').expect("host:port");
    let name = format!("drove-test-{}", std::process::id());
    let xml = tmp.path().join("domain.xml");
    std::fs::write(
        &xml,
        domain_xml(&name, &kit.kernel, &initrd, host, port, "lvdisk"),
    )
    .unwrap();

    let _daemon = Libvirtd::ensure();
    let o = virsh(&["define", xml.to_str().unwrap()]);
    assert!(o.status.success(), "virsh define: {}", text(&o));
    let o = virsh(&["start", &name]);
    let started = o.status.success();
    let start_out = text(&o);
    let shut_off = started && {
        let mut off = false;
        for _ in 0..600 {
            let s = text(&virsh(&["domstate", &name]));
            if s.contains("shut off") {
                off = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        off
    };
    let log =
        std::fs::read_to_string(format!("/var/log/libvirt/qemu/{name}.log")).unwrap_or_default();
    let _ = virsh(&["destroy", &name]);
    let _ = virsh(&["undefine", &name]);
    assert!(started, "virsh start: {start_out}\nQEMU log:\n{log}");
    assert!(
        shut_off,
        "the domain did not shut off within 300 s\nQEMU log:\n{log}"
    );
    assert!(
        log.contains("file.driver\":\"nbd\"") || log.contains("nbd"),
        "libvirt gave QEMU an NBD disk: {log}"
    );

    // Read the guest's answer through node 2.
    let data = read_image(&c.nodes[1].uri("lvdisk"), tmp.path(), (1 << 20) + 512);
    let answer = String::from_utf8_lossy(&data[1 << 20..(1 << 20) + 64]);
    assert!(
        answer.starts_with(&format!("{MARK} GUEST-OK")),
        "the guest did not read the mark or write its answer: {answer:?}\nQEMU log:\n{log}"
    );
}
