#!/usr/bin/env bash
# Holds an ext4 image mounted while the power-loss test (crates/cli/tests/e2e_power_loss.rs)
# works in it: `outagefs-hold.sh IMAGE MNT` mounts IMAGE on MNT through a loop device,
# prints "mounted", waits for a line on stdin (or its end), then unmounts.
#
# IMAGE is the file `outagefs mount --exec` passes as $1 (a FUSE file whose every write
# and fsync outagefs records, or replays with some writes dropped), or a plain image
# file when the test prepares the base image. The loop device goes away on unmount
# (mount -o loop sets autoclear).
set -u
image=$1
mnt=$2
mount -o loop -t ext4 "$image" "$mnt" || exit 1
echo mounted
read -r _ || true
# The test stops every process that works in MNT first; should one still hold a file
# open, detach lazily (the loop device, and with it the FUSE file, is let go once it
# ends) and fail, so the test hears of it.
umount "$mnt" || { umount -l "$mnt"; exit 1; }
