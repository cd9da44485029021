#!/bin/bash
# Needs root (tmpfs mount). Usage: DROVE=target/release/drove repro-full-disk-reattach.sh none|PCT DIR
# Prints ok, r2fail (the second round of writes failed) or BAD (data read back wrong).
# Reproduce e2e_heal's full-disk test by hand. $1 = backfill pct (or "none"), $2 = dir
set -u
D=$2; BF=$1; B=${DROVE:-/work/main/target/release/drove}
rm -rf $D; mkdir -p $D/node3/store
mount -t tmpfs -o size=24m tmpfs $D/node3/store
$B up --nodes 3 --zones 3 --dir $D --detach --base-port 0 --no-tls --no-auth > $D/up.log 2>&1 || { echo up failed; cat $D/up.log; exit 1; }
A1=$(python3 -c "import json;f=json.load(open('$D/cluster.json'));print(f['nodes'][0]['admin'])")
S1=$D/node1/nbd.sock; S3=$D/node3/nbd.sock
[ "$BF" != none ] && $B cluster config --backfill-full $BF --cluster $A1 > /dev/null
$B vdi create full 128M --copies 3 --cluster $A1 > /dev/null
qemu-io -f raw "nbd+unix:///full?socket=$S1" -c "write -P 0x60 0 4M" -c flush > /dev/null
qemu-io -f raw "nbd+unix:///full?socket=$S1" -c "write -P 0x61 8M 16M" -c "write -P 0x62 24M 16M" -c "write -P 0x63 40M 16M" -c "write -P 0x64 56M 16M" -c flush > $D/r1.log 2>&1
mount -o remount,size=512m $D/node3/store
qemu-io -f raw "nbd+unix:///full?socket=$S1" -c "write -P 0x61 8M 16M" -c "write -P 0x62 24M 16M" -c "write -P 0x63 40M 16M" -c "write -P 0x64 56M 16M" -c flush > $D/r2.log 2>&1
qemu-io -f raw "nbd+unix:///full?socket=$S3" -c "read -P 0x61 8M 16M" -c "read -P 0x62 24M 16M" -c "read -P 0x63 40M 16M" -c "read -P 0x64 56M 16M" -c "read -P 0x60 0 4M" > $D/r3.log 2>&1
if grep -q "failed" $D/r2.log; then R=r2fail; elif grep -q "Pattern verification failed" $D/r3.log; then R=BAD; else R=ok; fi
echo "$R $(grep -c failed $D/r1.log) $(grep Pattern $D/r3.log | tr '\n' ' ')"
$B down --dir $D > /dev/null 2>&1
umount -l $D/node3/store
