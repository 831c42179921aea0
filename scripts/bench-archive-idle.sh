#!/usr/bin/env bash
# What a drained, idle archiver costs: it archives N request_log rows
# (inserted with SQL, 5,000 a statement as ingest's batches, over a month of
# day partitions, as on the demo), then sits idle; its own CPU and that of
# the Postgres backends serving it are read from /proc/<pid>/stat over
# IDLE_SECS. Prints one line per run. The archiver binary is the workspace's
# (built in release mode) unless one is given, e.g. one built from an
# earlier commit (it migrates its own fresh database, so each binary runs on
# the schema it knows):
#   scripts/bench-archive-idle.sh                       # N=1000000 IDLE_SECS=30
#   N=2000000 scripts/bench-archive-idle.sh /tmp/archiver-before
# Needs the stack's Postgres on this machine (the backends' /proc entries).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
N="${N:-1000000}"
IDLE_SECS="${IDLE_SECS:-30}"
LINGER_MS="${LINGER_MS:-2000}" # the demo's ARCHIVE_LINGER_MS
bash scripts/stack.sh up >/dev/null 2>&1 || bash scripts/stack.sh up
# shellcheck disable=SC1091
. .stack/env
ARCHIVER="${1:-}"
if [ -z "$ARCHIVER" ]; then
  cargo build --quiet --release -p ingest --bin archiver
  ARCHIVER="${CARGO_TARGET_DIR:-$ROOT/target}/release/archiver"
fi
SERVER="${DATABASE_URL%/*}"
DB="mt_archive_idle_$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
WORK="$(mktemp -d)"
psql -qX "$SERVER/postgres" -c "CREATE DATABASE $DB"
cleanup() {
  [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  psql -qX "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
  rm -rf "$WORK"
}
trap cleanup EXIT
sql() { psql -qXAt "$SERVER/$DB" -c "$1"; }

DATABASE_URL="$SERVER/$DB" ARCHIVE_URL="$WORK/archive" ARCHIVE_LINGER_MS="$LINGER_MS" \
  ARCHIVE_METRICS_ADDR=127.0.0.1:0 ARCHIVE_COMPACT_EVERY_SECS=0 RUST_LOG=warn \
  "$ARCHIVER" >"$WORK/archiver.log" 2>&1 &
PID=$!
# The archiver migrates the database: wait for request_log.
until [ "$(sql "SELECT to_regclass('request_log') IS NOT NULL" 2>/dev/null)" = t ]; do
  kill -0 "$PID" || { cat "$WORK/archiver.log"; exit 1; }
  sleep 0.2
done
# A month of day partitions; the rows in the last day's, 5,000 a statement.
sql "SELECT ensure_request_log_partition(current_date - d) FROM generate_series(0, 30) d" >/dev/null
sql "DO \$\$
DECLARE base bigint := (extract(epoch FROM now()) * 1000)::bigint - $N - 60000;
BEGIN
  FOR lo IN 0..$N - 1 BY 5000 LOOP
    INSERT INTO request_log (request_id, tenant_id, api_key_id, model, model_version,
        priority, started_at, finished_at, prompt_tokens, cached_tokens, completion_tokens,
        gpu_seconds, preempted_gpu_seconds, finish_reason, replica_id, gateway_id, stream,
        content_hash, kafka_partition, kafka_offset)
    SELECT (lpad(to_hex(base + g), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') || '8'
            || lpad(to_hex(g), 15, '0'))::uuid,
           'acme-corp', 'k', 'llama-3.1-8b', 'v', 3, t, t, 10, 0, 5, 0.5, 0, 'stop', 'r', 'g',
           false, sha256(g::text::bytea), 0, g
    FROM generate_series(lo, least(lo + 4999, $N - 1)) g,
         LATERAL (SELECT to_timestamp((base + g) / 1000.0) AS t) s;
  END LOOP;
END \$\$"
started=$(date +%s)
until [ "$(sql "SELECT count(*) FROM archive_queue")" = 0 ]; do
  kill -0 "$PID" || { cat "$WORK/archiver.log"; exit 1; }
  sleep 0.5
done
drained=$(( $(date +%s) - started ))
# Two polls more: whatever the archiver does after draining is done.
sleep $(( 2 * LINGER_MS / 1000 + 1 ))

ticks() { # utime + stime of a pid, in clock ticks (0 once it is gone)
  [ -r "/proc/$1/stat" ] || { echo 0; return; }
  sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}
backends() { sql "SELECT pid FROM pg_stat_activity WHERE datname = '$DB' AND pid <> pg_backend_pid()"; }
hz=$(getconf CLK_TCK)
declare -A start
for p in $(backends); do start[$p]=$(ticks "$p"); done
a0=$(ticks "$PID")
sleep "$IDLE_SECS"
a1=$(ticks "$PID")
# A backend that appeared meanwhile counts from 0; one that left, not at all.
pg=0 n=0
for p in $(backends); do
  pg=$(( pg + $(ticks "$p") - ${start[$p]:-0} ))
  n=$(( n + 1 ))
done
pct() { awk -v t="$1" -v hz="$hz" -v s="$IDLE_SECS" 'BEGIN { printf "%.2f", 100 * t / hz / s }'; }
queue_bytes=$(sql "SELECT pg_total_relation_size(c.oid) FROM pg_class c WHERE relname IN ('archive_queue_batches', 'archive_queue') AND relkind = 'r'")
echo "archiver $(basename "$ARCHIVER"): $N rows drained in ${drained} s; idle ${IDLE_SECS} s at ARCHIVE_LINGER_MS=$LINGER_MS:" \
  "archiver $(pct $(( a1 - a0 )))% of a core, its Postgres backends ($n) $(pct "$pg")%;" \
  "queue table $(( queue_bytes / 1024 )) kB"
