#!/usr/bin/env bash
# ---------------------------------------------------------------------------
# install.sh [REMOTES]   (REMOTES: /var/lib/one/remotes by default)
#
# Installs the drove drivers into an OpenNebula front-end's remotes directory:
#   REMOTES/datastore/drove/   cp clone mkfs monitor rm stat  + drove.sh (helpers)
#   REMOTES/tm/drove/          clone cpds delete ln mkimage monitor mvds resize
#                              snap_create snap_create_live snap_delete snap_revert,
#                              and links to ../common for context, mkswap and the
#                              migration hooks
#   REMOTES/etc/datastore/drove/drove.conf   (kept when it exists)
#   REMOTES/vmm/kvm/drove_deploy_filter
# Then run, as oneadmin: onehost sync --force
# ---------------------------------------------------------------------------
set -euo pipefail
SRC=$(dirname "$(readlink -f "$0")")
REMOTES=${1:-/var/lib/one/remotes}
[ -d "$REMOTES" ] || { echo "ERROR: $REMOTES does not exist" >&2; exit 1; }

install -d "$REMOTES/datastore/drove" "$REMOTES/tm/drove" "$REMOTES/etc/datastore/drove" \
    "$REMOTES/vmm/kvm"
install -m 0755 "$SRC"/datastore/drove/* "$REMOTES/datastore/drove/"
install -m 0644 "$SRC/lib/drove.sh" "$REMOTES/datastore/drove/drove.sh"
for f in "$SRC"/tm/drove/*; do
    [ -L "$f" ] || install -m 0755 "$f" "$REMOTES/tm/drove/"
done
ln -sfn ../../datastore/drove/monitor "$REMOTES/tm/drove/monitor"
ln -sfn snap_create "$REMOTES/tm/drove/snap_create_live"
for f in context mkswap premigrate postmigrate failmigrate; do
    if [ -e "$REMOTES/tm/common/$f" ]; then
        ln -sfn "../common/$f" "$REMOTES/tm/drove/$f"
    fi
done
if [ ! -e "$REMOTES/etc/datastore/drove/drove.conf" ]; then
    install -m 0644 "$SRC/etc/datastore/drove/drove.conf" "$REMOTES/etc/datastore/drove/"
fi
install -m 0755 "$SRC/vmm/kvm/drove_deploy_filter" "$REMOTES/vmm/kvm/"
echo "drove drivers installed in $REMOTES; see docs/opennebula.md for oned.conf,"
echo "the datastore templates and the deploy hook; then: onehost sync --force"
