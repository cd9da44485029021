#!/usr/bin/env bash
# Installs what drove's demo, tests and benchmarks need on Debian 12: the real NBD
# clients (qemu-img/qemu-io, nbdinfo/nbdcopy, fio), qemu-nbd (the benchmark baseline),
# QEMU and a kernel for VM tests, libvirt and Prometheus for their tests, dpkg-dev and
# systemd (systemd-analyze) for the Debian package and its test, FUSE (libfuse-dev, fuse) and
# outagefs for the power-loss test. Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(qemu-utils qemu-system-x86 qemu-block-extra libnbd-bin python3-libnbd nbdkit fio busybox-static
      linux-image-amd64 build-essential pkg-config curl ca-certificates iproute2 python3
      cpio e2fsprogs openssl prometheus libvirt-daemon-system libvirt-clients dpkg-dev systemd
      libfuse-dev)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${pkgs[@]}"; do
  installed "$p" || missing+=("$p")
done
# fuse (fusermount, for libfuse 2 that outagefs links) unless fuse3 is there: fuse3 breaks
# fuse, and installing one removes the other with whatever depends on it.
installed fuse || installed fuse3 || missing+=(fuse)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# toxiproxy, the WAN delay proxy of `drove bench paper`, built with Go into $(go env GOPATH)/bin/server.
GO="$(command -v go || echo /usr/local/go/bin/go)"
if [ -x "$GO" ]; then
  TOXI_BIN="$("$GO" env GOPATH)/bin/server"
  if ! { [ -x "$TOXI_BIN" ] && "$GO" version -m "$TOXI_BIN" 2>/dev/null | grep -q 'Shopify/toxiproxy/v2[[:space:]]*v2\.12\.0'; }; then
    echo "==> go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0"
    GOBIN= "$GO" install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0
  fi
else
  echo "error: Go is not installed (no go on PATH, no /usr/local/go/bin/go): cannot build toxiproxy, the WAN delay proxy of 'drove bench paper'. Install Go (https://go.dev/dl) and run this again; until then 'drove bench paper' fails and its test fails under CI (CI=true) or reports SKIPPED elsewhere." >&2
fi
# matplotlib, for the charts of `drove bench paper` (they are skipped without it). Debian's own
# python3 refuses a plain pip install (PEP 668): then --break-system-packages, then the package.
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib 2>/dev/null \
  || python3 -m pip install -q --break-system-packages matplotlib 2>/dev/null \
  || { $SUDO apt-get install -y -qq python3-matplotlib >/dev/null 2>&1 && python3 -c 'import matplotlib'; } \
  || echo "warning: cannot install matplotlib for python3: 'drove bench paper' will skip its charts" >&2
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    echo "==> cargo is in ~/.cargo/bin: add it to PATH (source ~/.cargo/env)"
  else
    echo "error: no Rust toolchain. drove needs Rust >= 1.85 (Debian 12's packaged cargo is too old)." >&2
    echo "Install rustup (https://rustup.rs), then run this again." >&2
  fi
  exit 1
fi
# outagefs, the recording FUSE file of the power-loss test (crates/cli/tests/e2e_power_loss.rs),
# with cargo install into ~/.cargo/bin; it builds against libfuse-dev (pkg-config fuse).
if ! command -v outagefs >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/outagefs" ]; then
  echo "==> cargo install --locked outagefs@0.1.0"
  cargo install --locked --quiet outagefs@0.1.0
fi
echo "==> dependencies present: $(cargo --version), $(qemu-img --version | head -1), $(fio --version)"
