#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and property tests, and the
# end-to-end tests against the real Postgres, broker and Redis (which this
# script brings up first; the broker's first build takes ~17 minutes).
# Test binaries and tests run in parallel (cargo-nextest): a test that kills
# or restarts a dependency has a private instance of it, so nothing here
# touches another test's services. METERLINE_TEST_THREADS sets how many
# tests run at once (default 4).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
SUITE_STARTED=$(date +%s)
# A one-shot build (CI's fresh clone) gains nothing from incremental
# compilation's cache, which would add about 2 GB to target/.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
echo "== disk: $(df -h --output=avail "$ROOT" | tail -1 | tr -d ' ') free where target/ is built (the suite's build needs about 6 GB)"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "== installing cargo-nextest (the suite's test runner)"
  cargo install --locked cargo-nextest
fi
bash scripts/stack.sh up
bash scripts/ensure-tools.sh
# shellcheck disable=SC1091
. .stack/env
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== settings reference: docs/settings.md against the binaries"
cargo run --quiet -p settings-doc -- --check
echo "== build the services the end-to-end tests start"
cargo build --workspace --bins --quiet
echo "== cargo nextest run"
LOG="$ROOT/.stack/test-output.log"
set +e
cargo nextest run --workspace --test-threads "${METERLINE_TEST_THREADS:-4}" 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
echo "== doc tests"
cargo test --workspace --doc --quiet 2>&1 | tee "$LOG.doc"
doc_status=${PIPESTATUS[0]}
set -e
# The budget to keep in view: CI has 90 minutes on a fresh machine.
echo "suite wall time: $(( $(date +%s) - SUITE_STARTED )) s (stack, tools, fmt, clippy, build and tests)"
# One closing line for the whole suite: nextest's summary plus the doc tests.
awk '/^ *Summary \[/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|timed)/) f += $i } }
     /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$LOG" "$LOG.doc"
[ "$status" = 0 ] && [ "$doc_status" = 0 ]
