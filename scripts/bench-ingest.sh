#!/usr/bin/env bash
# The ingest benchmark: brings the stack up, builds ingest-bench (crate bench)
# and the ingest binary it starts in release mode, and runs ingest-bench, which
# measures ingest against the broker-read and raw COPY ceilings on a fresh
# database and topic, plus produce → visible freshness, and prints a table.
# Flags go to ingest-bench (scripts/bench-ingest.sh --help):
#   scripts/bench-ingest.sh --events 400000 --max-batch 10000 --linger-ms 100
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
bash scripts/stack.sh up
# shellcheck disable=SC1091
. .stack/env
cargo build --release -p bench -p ingest --bin ingest-bench --bin ingest
exec "${CARGO_TARGET_DIR:-$ROOT/target}/release/ingest-bench" "$@"
