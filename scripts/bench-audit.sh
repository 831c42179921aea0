#!/usr/bin/env bash
# The audit benchmark: brings the stack up, builds audit-bench (crate bench) in
# release mode and runs it on a fresh database: N events (default 10000000) of
# the reference tenants over 30 days written as compacted archive files, then
# the audit's DataFusion scan of the month timed against the parquet crate
# reading the same columns.
#   scripts/bench-audit.sh 20000000
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
bash scripts/stack.sh up
# shellcheck disable=SC1091
. .stack/env
cargo build --release -p bench --bin audit-bench
exec "${CARGO_TARGET_DIR:-$ROOT/target}/release/audit-bench" "$@"
