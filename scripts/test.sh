#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and property tests, and the
# end-to-end tests that start real node processes and drive them with real clients
# (qemu-io, qemu-img, nbdinfo, fio). Release mode: the same build as the demo, and
# the I/O tests run at a realistic speed.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy -D warnings"
cargo clippy --release --locked --workspace --all-targets -- -D warnings
echo "==> cargo test (unit, property, multi-process end-to-end)"
cargo test --release --locked --workspace --no-fail-fast -- --test-threads=2
echo "==> demo (make demo's script, as a user runs it)"
bash scripts/demo.sh
