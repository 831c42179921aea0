#!/usr/bin/env bash
# The ingest benchmark: brings the stack up, builds ingest-bench (crate bench)
# and the ingest binary it starts in release mode, and runs ingest-bench, which
# measures ingest against the broker-read and raw COPY ceilings on fresh
# databases and topics, plus produce → visible freshness, and prints a table.
# Before and after come from one run: each of ingest's write paths
# (INGEST_WRITE_PATH; `--paths unnest,rows` by default, `unnest` being the
# earlier statements) is measured in turn, its transactions against the raw
# COPY of the same round (`--rounds`, 3 by default).
# Flags go to ingest-bench (scripts/bench-ingest.sh --help):
#   scripts/bench-ingest.sh --events 400000 --max-batch 10000 --linger-ms 100
#   scripts/bench-ingest.sh --paths rows --rounds 5 --ceilings-only
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
bash scripts/stack.sh up
# shellcheck disable=SC1091
. .stack/env
cargo build --release -p bench -p ingest --bin ingest-bench --bin ingest
exec "${CARGO_TARGET_DIR:-$ROOT/target}/release/ingest-bench" "$@"
