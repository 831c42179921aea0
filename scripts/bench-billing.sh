#!/usr/bin/env bash
# Billing benchmark: draft invoices for 1,000 tenants × 3 models × 720 hours.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
bash scripts/stack.sh up >/dev/null
# shellcheck disable=SC1091
. .stack/env
cargo build --release --quiet -p bench --bin billing-bench
exec target/release/billing-bench "$@"
