//! A real QEMU VM (TCG, Debian's kernel, a busybox initramfs) with its virtio disk on
//! a drove VDI over NBD: the guest makes a filesystem, writes files and checksums
//! them; the checksum read from the host agrees; the disk is snapshotted and cloned,
//! and a second boot from the clone, attached through another node, finds the same
//! files, writes to its clone, and leaves the original untouched.
mod common;
use common::vm::VmKit;
use common::*;
use std::time::Duration;

#[test]
fn test_vm_writes_files_on_drove_and_a_second_boot_from_a_clone_reads_them() {
    let Some(kit) = require_ok(VmKit::find()) else {
        return;
    };
    let c = Cluster::start(3, 3);
    c.create_vdi("vmdisk", "128M", &["--copies", "3"]);
    let tmp = tempfile::tempdir().unwrap();

    let write = kit.initramfs(
        &tmp.path().join("w"),
        "mke2fs -q /dev/vda && mount /dev/vda /mnt && \
         dd if=/dev/urandom of=/mnt/data.bin bs=1M count=16 2>/dev/null && \
         echo hello-from-the-guest > /mnt/hello.txt && \
         (cd /mnt && md5sum data.bin hello.txt > sums) && \
         sed 's/^/DROVE-SUM /' /mnt/sums && umount /mnt && echo DROVE-WRITE-DONE",
    );
    let out = kit.boot(&write, &c.nodes[0].uri("vmdisk"), Duration::from_secs(300));
    assert!(
        out.contains("DROVE-WRITE-DONE"),
        "first boot failed:\n{out}"
    );
    let sums: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("DROVE-SUM "))
        .collect();
    assert_eq!(sums.len(), 2, "{out}");

    // From the host: copy the disk out through node 2 and read the file with debugfs.
    if require(&["debugfs", "qemu-img"]) {
        let raw = tmp.path().join("disk.raw");
        let o = run(std::process::Command::new("qemu-img").args([
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &c.nodes[1].uri("vmdisk"),
            raw.to_str().unwrap(),
        ]));
        assert!(o.status.success(), "{}", text(&o));
        let file = tmp.path().join("data.bin");
        let o = run(std::process::Command::new("debugfs").args([
            "-R",
            &format!("dump /data.bin {}", file.display()),
            raw.to_str().unwrap(),
        ]));
        assert!(o.status.success(), "{}", text(&o));
        let o = run(std::process::Command::new("md5sum").arg(&file));
        let host_sum = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        let guest_sum = sums
            .iter()
            .find(|l| l.ends_with("data.bin"))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap();
        assert_eq!(host_sum, guest_sum, "the host reads what the guest wrote");
    }

    // The disk as a golden image: snapshot it, boot a clone of it (copy-on-write).
    let o = c.drove(1, &["vdi", "snapshot", "vmdisk", "gold"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.drove(2, &["vdi", "clone", "gold", "vm2"]);
    assert!(o.status.success(), "{}", text(&o));
    let read = kit.initramfs(
        &tmp.path().join("r"),
        "mount /dev/vda /mnt && cd /mnt && md5sum -c sums && \
         sed 's/^/DROVE-SUM /' sums && cat hello.txt && echo clone-only > clone.txt && \
         cd / && umount /mnt && echo DROVE-VERIFY-OK",
    );
    let out2 = kit.boot(&read, &c.nodes[2].uri("vm2"), Duration::from_secs(300));
    assert!(
        out2.contains("DROVE-VERIFY-OK"),
        "second boot failed:\n{out2}"
    );
    assert!(out2.contains("hello-from-the-guest"), "{out2}");
    let sums2: Vec<&str> = out2
        .lines()
        .filter(|l| l.starts_with("DROVE-SUM "))
        .collect();
    assert_eq!(sums, sums2, "the same files, the same checksums");

    // The clone's write stayed in the clone: the original has no clone.txt.
    let check = kit.initramfs(
        &tmp.path().join("o"),
        "mount -o ro /dev/vda /mnt && ls /mnt && (test -e /mnt/clone.txt && echo DROVE-LEAK || echo DROVE-APART) && \
         umount /mnt",
    );
    let out3 = kit.boot(&check, &c.nodes[0].uri("vmdisk"), Duration::from_secs(300));
    assert!(
        out3.contains("DROVE-APART"),
        "the original saw the clone's file:\n{out3}"
    );
}
