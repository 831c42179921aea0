#!/usr/bin/env bash
# The main job: bring the stack up, start gateway-lite, ingest, the archiver
# and billing-api, backfill and finalize an ended month of the five
# reference tenants' traffic (once; a second run finds it), drive live
# traffic, and print what each tenant used and was billed.
# Services keep running afterwards: stop them with `scripts/demo.sh stop`,
# the stack with `scripts/stack.sh down`. Settings: see `target/debug/demo --help`.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
if [ "${1:-}" != stop ]; then
  bash scripts/stack.sh up
fi
if [ -f .stack/env ]; then
  # shellcheck disable=SC1091
  . .stack/env
fi
echo "demo: building the services"
cargo build --quiet --bins
exec target/debug/demo --root "$ROOT" "$@"
