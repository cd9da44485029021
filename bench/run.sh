#!/usr/bin/env bash
# make bench: fio against drove (3 nodes, copies=3, local unix socket) and against
# qemu-nbd on a raw file on the same disk, alternating; writes bench/results/DATE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/bench.py "$@"
