#!/usr/bin/env bash
# The main job: bring the stack up, start ingest, the archiver, gateway-lite and
# billing-api, drive traffic from the five reference tenants, and print what each used.
# Services keep running afterwards (stop them with scripts/demo.sh stop, the
# stack with scripts/stack.sh down).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
RUN="$ROOT/.stack/demo"
mkdir -p "$RUN"

stop_services() {
  for name in gateway ingest archiver billing; do
    if [ -f "$RUN/$name.pid" ]; then
      pid=$(cat "$RUN/$name.pid")
      if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        # Graceful: the gateway drains its outbox, ingest commits its batch,
        # the archiver writes what it holds.
        for _ in $(seq 1 150); do
          [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)" = Z ] && break
          sleep 0.1
        done
      fi
      rm -f "$RUN/$name.pid"
    fi
  done
}
if [ "${1:-}" = stop ]; then stop_services; echo "demo: services stopped"; exit 0; fi

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup" >&2; exit 1; }
bash scripts/stack.sh up
# shellcheck disable=SC1091
. .stack/env
echo "demo: building the services"
cargo build --quiet --bins
stop_services

export BILLING_BOOTSTRAP_FINANCE_TOKEN="${BILLING_BOOTSTRAP_FINANCE_TOKEN:-demo-finance-token-0001}"
export BILLING_PRICE_BOOK_FILE="${BILLING_PRICE_BOOK_FILE:-$ROOT/config/price-book.yaml}"
export GATEWAY_TENANTS_FILE="${GATEWAY_TENANTS_FILE:-$ROOT/config/tenants.yaml}"
export GATEWAY_OUTBOX="${GATEWAY_OUTBOX:-$RUN/gateway-outbox}"
export ENGINE_SPEEDUP="${ENGINE_SPEEDUP:-20}"
export ARCHIVE_URL="${ARCHIVE_URL:-$ROOT/.stack/archive}"
export ARCHIVE_LINGER_MS="${ARCHIVE_LINGER_MS:-2000}"
start() { # start <name> <binary>
  nohup "target/debug/$2" >>"$RUN/$1.log" 2>&1 </dev/null &
  echo $! >"$RUN/$1.pid"
}
wait_http() { # wait_http <name> <url>
  for _ in $(seq 1 200); do
    curl -fsS "$2" >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null || { echo "error: $1 exited; last lines of $RUN/$1.log:" >&2; tail -n 20 "$RUN/$1.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "error: $1 did not answer at $2 within 20 s; see $RUN/$1.log" >&2; exit 1
}
start gateway gateway-lite
wait_http gateway http://127.0.0.1:8080/healthz
start ingest ingest
start archiver archiver
start billing billing-api
wait_http billing http://127.0.0.1:8082/healthz
echo "demo: gateway :8080, billing-api :8082, ingest metrics :9101, archiver metrics :9102 (logs in .stack/demo/)"
target/debug/demo
# The archiver writes a batch once its first message has waited ARCHIVE_LINGER_MS.
sleep $(( ARCHIVE_LINGER_MS / 1000 + 2 ))
# The manifest is the database's: it also lists what earlier demo runs on this
# database archived (their files are where those runs' ARCHIVE_URL was).
echo "demo: archive manifest, every run on this database: $(psql "$DATABASE_URL" -X -A -t -c \
  "SELECT count(path) || ' Parquet files, ' || coalesce(sum(rows), 0) || ' events' FROM archive_manifest" 2>/dev/null || echo 'not readable'); this run's files are in $ARCHIVE_URL"
echo "demo: services are still running; stop them with: scripts/demo.sh stop"
