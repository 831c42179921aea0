#!/usr/bin/env bash
# The archive benchmark: brings the stack up, builds archive-bench (crate bench)
# and the archiver binary it starts in release mode, and runs archive-bench on
# a fresh database and topic: N events (default 200000) produced, then the
# archiver timed until its offsets cover them all; files, bytes, CPU, memory
# and a read-back check.
#   scripts/bench-archive.sh 400000
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
bash scripts/stack.sh up
# shellcheck disable=SC1091
. .stack/env
cargo build --release -p bench -p ingest --bin archive-bench --bin archiver
exec "${CARGO_TARGET_DIR:-$ROOT/target}/release/archive-bench" "$@"
