#!/usr/bin/env bash
# Installs what drove's demo, tests and benchmarks need on Debian 12: the real NBD
# clients (qemu-img/qemu-io, nbdinfo/nbdcopy, fio), qemu-nbd (the benchmark baseline),
# QEMU and a kernel for VM tests. Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(qemu-utils qemu-system-x86 qemu-block-extra libnbd-bin nbdkit fio busybox-static
      linux-image-amd64 build-essential pkg-config curl ca-certificates iproute2 python3
      cpio e2fsprogs)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    echo "==> cargo is in ~/.cargo/bin: add it to PATH (source ~/.cargo/env)"
  else
    echo "error: no Rust toolchain. drove needs Rust >= 1.85 (Debian 12's packaged cargo is too old)." >&2
    echo "Install rustup (https://rustup.rs), then run this again." >&2
  fi
  exit 1
fi
echo "==> dependencies present: $(cargo --version), $(qemu-img --version | head -1), $(fio --version)"
