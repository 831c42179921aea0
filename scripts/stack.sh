#!/usr/bin/env bash
# The local stack — Postgres, the Nisshi broker (with topic usage.events.v1)
# and Redis — through the dev stack's binary (crate `devstack`; its docs say
# which server each comes from and which settings change that).
#
#   scripts/stack.sh up       start what is missing (safe to run again), write .stack/env
#   scripts/stack.sh down     stop what `up` started (never the machine's own servers)
#   scripts/stack.sh status   one line per component; exit 1 if something is not running
#   scripts/stack.sh env      print .stack/env (source it: . .stack/env)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
cargo build --quiet -p devstack --bin devstack
exec "$ROOT/target/debug/devstack" --root "$ROOT" "$@"
