#!/usr/bin/env bash
# The rolling-upgrade test (issue 44, item 4): a cluster of the last release,
# upgraded node by node to this build under fio writes with verify and a VM
# checking its own disk (crates/cli/tests/e2e_rolling_upgrade.rs). Builds the last release's binary from
# its git commit once (in target/old-release, a worktree and target of its own;
# 10-20 minutes on 2 cores), then runs the test and keeps its output in
# bench/results/rolling-upgrade-DATE.txt.
#
#   scripts/rolling-upgrade.sh [COMMIT]      # default: 5def163, the last release
#   DROVE_OLD_BIN=PATH scripts/rolling-upgrade.sh   # an old binary built elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
commit="${1:-5def163}"
if [ -z "${DROVE_OLD_BIN:-}" ]; then
    src="target/old-release/$commit"
    if [ ! -d "$src" ]; then
        echo "==> git worktree of $commit in $src"
        git worktree add --detach "$src" "$commit"
    fi
    echo "==> building drove at $commit (its own target directory)"
    (cd "$src" && cargo build --release --locked -p drove)
    DROVE_OLD_BIN="$PWD/$src/target/release/drove"
fi
export DROVE_OLD_BIN
echo "==> building this build's tests"
cargo build --release --locked -p drove
out="bench/results/rolling-upgrade-$(date -u +%Y-%m-%d).txt"
# A second run on the same day keeps the first one's result.
[ -e "$out" ] && out="bench/results/rolling-upgrade-$(date -u +%Y-%m-%d-%H%M).txt"
mkdir -p bench/results
{
    echo "# scripts/rolling-upgrade.sh $commit   ($(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores)"
    echo "# old: $DROVE_OLD_BIN ($("$DROVE_OLD_BIN" --version)); new: $(git rev-parse --short HEAD)"
} > "$out"
CI=true cargo test --release --locked -p drove --test e2e_rolling_upgrade -- \
    --ignored --nocapture --test-threads=1 2>&1 | tee -a "$out"
echo "==> kept in $out"
