#!/usr/bin/env bash
# Brings the local Meterline stack up and down: Postgres and the Nisshi Kafka-compatible broker.
#
#   scripts/stack.sh up              start what is missing (safe to run again), write .stack/env
#   scripts/stack.sh down            stop what `up` started (never the machine's system Postgres)
#   scripts/stack.sh status          one line per component; exit 1 if something is not running
#   scripts/stack.sh env             print .stack/env (eval "$(scripts/stack.sh env)", or source it)
#   scripts/stack.sh restart-broker  kill -9 the broker and start it again (fault drills)
#   scripts/stack.sh stop-broker     stop the broker stack.sh started, leaving it down (outage tests)
#   scripts/stack.sh start-broker    start it again after stop-broker (nothing if it is running)
#   scripts/stack.sh restart-postgres  restart the Postgres server the stack uses (fault drills)
#
# Postgres: $DATABASE_URL if set; else the server on 127.0.0.1:5432 if one answers; else a
# project-local cluster in .stack/pg on 127.0.0.1:$METERLINE_LOCAL_PG_PORT (default 55432),
# installing Debian's postgresql first if needed. METERLINE_FORCE_LOCAL_PG=1 skips the 5432 probe.
# Kafka: $KAFKA_BROKERS if set (no broker is started); else nisshi on 127.0.0.1:9092, with topic
# usage.events.v1 ($METERLINE_PARTITIONS partitions, default 4).
# Values that .stack/env itself exported are not taken as user settings, so running `up` from a
# shell that sourced .stack/env behaves like running it from a clean shell.
set -Eeuo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd "$SCRIPT_DIR/.." && pwd -P)"
STACK="$ROOT/.stack"
ENV_FILE="$STACK/env"
STATE_FILE="$STACK/state"
PG_DATA="$STACK/pg"
PG_LOG="$STACK/pg.log"
NISSHI_PID_FILE="$STACK/nisshi.pid"
NISSHI_LOG="$STACK/nisshi.log"

TOPIC="${METERLINE_TOPIC:-usage.events.v1}"
PARTITIONS="${METERLINE_PARTITIONS:-4}"
LOCAL_PG_PORT="${METERLINE_LOCAL_PG_PORT:-55432}"
BROKER_HOST=127.0.0.1
BROKER_PORT="${METERLINE_BROKER_PORT:-9092}"
WAIT_SECS="${METERLINE_STACK_WAIT:-30}"
CMD="${1:-}"

say() { printf 'stack: %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
# An unexpected failure gets one line, printed once (not again by each enclosing subshell).
on_err() {
  local rc=$1
  if [ "$BASHPID" = "$$" ]; then
    printf 'error: stack.sh %s: unexpected failure (exit %s) at line %s: %s\n' \
      "$CMD" "$rc" "$2" "$3" >&2
  fi
  exit "$rc"
}
trap 'on_err $? $LINENO "$BASH_COMMAND"' ERR

need() { # need <command> <how to fix>
  command -v "$1" >/dev/null 2>&1 || die "$1 not found; $2"
}
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_uint "$PARTITIONS" && [ "$PARTITIONS" -gt 0 ] ||
  die "METERLINE_PARTITIONS must be a positive integer, not '$PARTITIONS'"
is_uint "$WAIT_SECS" || die "METERLINE_STACK_WAIT must be a number of seconds, not '$WAIT_SECS'"
is_uint "$LOCAL_PG_PORT" || die "METERLINE_LOCAL_PG_PORT must be a port number, not '$LOCAL_PG_PORT'"
is_uint "$BROKER_PORT" || die "METERLINE_BROKER_PORT must be a port number, not '$BROKER_PORT'"
BROKER_URL="tcp://$BROKER_HOST:$BROKER_PORT"

# Hides the password in a URL for messages.
redact() { printf '%s' "$1" | sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#'; }

# True when something accepts TCP connections on host $1 port $2.
port_open() { timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; }

# Runs psql against URL $1 with SQL $2; output (stdout+stderr) in PSQL_OUT.
PSQL_OUT=""
run_psql() {
  local rc=0
  PSQL_OUT="$(PGCONNECT_TIMEOUT=5 psql "$1" -X -q -A -t -v ON_ERROR_STOP=1 -c "$2" 2>&1)" || rc=$?
  return "$rc"
}
# The first line of psql's message, without its "psql: error: " prefix.
psql_err() { printf '%s\n' "$PSQL_OUT" | sed '/^[[:space:]]*$/d' | head -n 1 | sed -E 's/^psql:([^:]*:[0-9]+:)? *(error: *)?//'; }
last_line() { printf '%s\n' "$1" | sed '/^[[:space:]]*$/d' | tail -n 1; }

# Makes sure database $3 is reachable through URL $1, creating it through admin URL $2 if needed.
ensure_db() {
  local url=$1 admin=$2 db=$3
  run_psql "$url" 'SELECT 1' && return 0
  if ! run_psql "$admin" "SELECT 1 FROM pg_database WHERE datname = '$db'"; then
    die "cannot connect to Postgres at $(redact "$admin"): $(psql_err)"
  fi
  if [ "$PSQL_OUT" != 1 ]; then
    run_psql "$admin" "CREATE DATABASE \"$db\"" || [[ "$PSQL_OUT" == *"already exists"* ]] ||
      die "cannot create database $db at $(redact "$admin"): $(psql_err)"
    say "created database $db"
  fi
  run_psql "$url" 'SELECT 1' ||
    die "cannot connect to database $db at $(redact "$url"): $(psql_err)"
}

load_state() { # sets the S_* variables from .stack/state, if there is one
  S_PG_MODE="" S_PG_ADDR="" S_DATABASE_URL="" S_KAFKA_MODE="" S_KAFKA_BROKERS=""
  S_NISSHI_BIN="" S_NISSHI_STORAGE=""
  # shellcheck disable=SC1090
  if [ -f "$STATE_FILE" ]; then . "$STATE_FILE"; fi
}

# ---------------------------------------------------------------- Postgres

PG_MODE="" PG_ADDR="" DB_URL="" ADMIN_URL="" NISSHI_STORAGE=""

# The database directory of the project-local cluster's server binaries, in PG_BIN.
PG_BIN=""
find_pg_bin() {
  local dir
  for dir in "$(pg_config --bindir 2>/dev/null || true)" \
             "$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/x)")" \
             $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then PG_BIN=$dir; return 0; fi
  done
  return 1
}

# As root, the local cluster runs as the postgres OS user (initdb refuses root), or as a
# dedicated meterline-pg user when there is no postgres user.
PG_OS_USER=""
as_pg() {
  if [ -n "$PG_OS_USER" ]; then (cd / && runuser -u "$PG_OS_USER" -- "$@"); else (cd / && "$@"); fi
}
pick_pg_os_user() {
  [ "$(id -u)" = 0 ] || { PG_OS_USER=""; return 0; }
  need runuser "install util-linux (apt-get install -y util-linux)"
  if id postgres >/dev/null 2>&1; then
    PG_OS_USER=postgres
  else
    PG_OS_USER=meterline-pg
    id "$PG_OS_USER" >/dev/null 2>&1 ||
      useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
        "$PG_OS_USER" || die "cannot create OS user $PG_OS_USER to run the local Postgres cluster"
  fi
}

local_pg_running() { [ -f "$PG_DATA/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; }

start_local_pg() {
  if ! find_pg_bin; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "installing Debian's postgresql (log: .stack/apt.log)"
      { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; } \
        >"$STACK/apt.log" 2>&1 ||
        die "apt-get install postgresql failed; see $STACK/apt.log ($(last_line "$(tail -n 5 "$STACK/apt.log")"))"
      find_pg_bin || die "postgresql is installed but initdb/pg_ctl were not found under /usr/lib/postgresql/*/bin"
    else
      die "PostgreSQL server binaries (initdb, pg_ctl) not found; install them: sudo apt-get install -y postgresql"
    fi
  fi
  need psql "install postgresql-client (apt-get install -y postgresql-client)"
  pick_pg_os_user
  mkdir -p "$PG_DATA"
  touch "$PG_LOG"
  if [ -n "$PG_OS_USER" ]; then chown "$PG_OS_USER" "$PG_DATA" "$PG_LOG"; fi
  as_pg test -w "$PG_DATA" -a -w "$PG_LOG" ||
    die "OS user ${PG_OS_USER:-$(id -un)} cannot write $PG_DATA (a parent directory is not searchable?); chmod o+x the parent directories"
  if [ ! -f "$PG_DATA/PG_VERSION" ]; then
    say "initializing project-local Postgres cluster in .stack/pg ($("$PG_BIN/pg_ctl" --version))"
    chmod 700 "$PG_DATA"
    as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C \
      >>"$PG_LOG" 2>&1 || die "initdb failed; see $PG_LOG"
    # TCP on 127.0.0.1 only, no Unix socket (its default directory may not be writable).
    printf "\n# added by scripts/stack.sh\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n" \
      >>"$PG_DATA/postgresql.conf"
  fi
  if local_pg_running; then
    say "project-local Postgres already running on 127.0.0.1:$LOCAL_PG_PORT"
  else
    if port_open 127.0.0.1 "$LOCAL_PG_PORT"; then
      die "port $LOCAL_PG_PORT is used by another process; stop it or set METERLINE_LOCAL_PG_PORT"
    fi
    say "starting project-local Postgres on 127.0.0.1:$LOCAL_PG_PORT (log: .stack/pg.log)"
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -o "-p $LOCAL_PG_PORT" -w -t "$WAIT_SECS" \
      start >/dev/null 2>&1 8>&- ||
      die "the project-local Postgres did not start; last lines of $PG_LOG: $(tail -n 3 "$PG_LOG" | tr '\n' ' ')"
  fi
}

choose_postgres() {
  if [ -n "${DATABASE_URL:-}" ] && [ "$DATABASE_URL" != "${METERLINE_STACK_DATABASE_URL:-}" ]; then
    need psql "install postgresql-client (apt-get install -y postgresql-client)"
    [[ "$DATABASE_URL" =~ ^(postgres(ql)?://[^/?]*)(/[^?]*)?(\?.*)?$ ]] ||
      die "DATABASE_URL must be a postgres://user@host:port/db URL, not '$(redact "$DATABASE_URL")'"
    local base=${BASH_REMATCH[1]} path=${BASH_REMATCH[3]} query=${BASH_REMATCH[4]}
    local db=${path#/} nq=$query
    [ -n "$db" ] || die "DATABASE_URL names no database: '$(redact "$DATABASE_URL")'"
    case "$nq" in *sslmode=*) ;; "") nq="?sslmode=disable" ;; *) nq="$nq&sslmode=disable" ;; esac
    PG_MODE=external PG_ADDR=${base#*://}; PG_ADDR=${PG_ADDR##*@}
    DB_URL=$DATABASE_URL ADMIN_URL="$base/postgres$query" NISSHI_STORAGE="$base/nisshi$nq"
    say "Postgres: using DATABASE_URL ($(redact "$DB_URL"))"
    ensure_db "$DB_URL" "$ADMIN_URL" "$db"
    return 0
  fi
  local port=""
  if [ "${METERLINE_FORCE_LOCAL_PG:-0}" = 1 ]; then
    say "Postgres: METERLINE_FORCE_LOCAL_PG=1, skipping the server on 127.0.0.1:5432"
  elif command -v pg_isready >/dev/null 2>&1; then
    local rc=0
    pg_isready -q -h 127.0.0.1 -p 5432 -t 3 || rc=$?
    case $rc in
      0) port=5432 ;;
      1) die "the Postgres server on 127.0.0.1:5432 is rejecting connections (starting up or shutting down); retry in a moment" ;;
    esac
  elif port_open 127.0.0.1 5432; then
    die "pg_isready not found; install postgresql-client (apt-get install -y postgresql-client)"
  fi
  if [ -n "$port" ]; then
    need psql "install postgresql-client (apt-get install -y postgresql-client)"
    PG_MODE=system
    say "Postgres: using the server on 127.0.0.1:5432"
  else
    start_local_pg
    PG_MODE=local port=$LOCAL_PG_PORT
  fi
  PG_ADDR="127.0.0.1:$port"
  DB_URL="postgres://postgres@127.0.0.1:$port/meterline"
  ADMIN_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
  NISSHI_STORAGE="postgres://postgres:postgres@127.0.0.1:$port/nisshi?sslmode=disable"
  ensure_db "$DB_URL?sslmode=disable" "$ADMIN_URL" meterline
}

# ---------------------------------------------------------------- Nisshi broker

NISSHI_BIN=""
get_nisshi() {
  NISSHI_BIN="$("$SCRIPT_DIR/ensure-nisshi.sh" 8>&-)" || die "could not get the nisshi binary (see above)"
  [ -x "$NISSHI_BIN" ] || die "scripts/ensure-nisshi.sh printed '$NISSHI_BIN', which is not an executable"
}

# Runs `nisshi` from .stack (it reads a .env file from its working directory) with a known log
# level, killed after <secs> seconds: nisshi timeout <secs> <args>.
nisshi() {
  local secs=$2; shift 2
  (cd "$STACK" && NO_COLOR=1 RUST_LOG=warn timeout "$secs" "$NISSHI_BIN" "$@" </dev/null)
}

# True while process $1 exists and is not a zombie (PID 1 here may never reap the broker's zombie).
pid_running() {
  local stat
  kill -0 "$1" 2>/dev/null && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# The pid of the broker that stack.sh started, if it is alive, in BROKER_PID.
BROKER_PID=""
broker_alive() {
  BROKER_PID=""
  [ -f "$NISSHI_PID_FILE" ] || return 1
  local pid; pid=$(cat "$NISSHI_PID_FILE" 2>/dev/null || true)
  is_uint "$pid" && pid_running "$pid" || return 1
  local cmdline
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ "$cmdline" == *nisshi*" broker "* ]] || return 1
  BROKER_PID=$pid
}

start_broker() {
  [ -n "$NISSHI_STORAGE" ] || die "no storage URL for the broker; run scripts/stack.sh up"
  printf '=== %s scripts/stack.sh starts: nisshi broker --storage-engine %s --listener-url %s\n' \
    "$(date -u +%FT%TZ)" "$(redact "$NISSHI_STORAGE")" "$BROKER_URL" >>"$NISSHI_LOG"
  rm -f "$NISSHI_PID_FILE"
  local from; from=$(($(wc -l <"$NISSHI_LOG") + 1))
  # The exec'ing shell writes its own pid, which becomes the broker's pid.
  (cd "$STACK" && NO_COLOR=1 RUST_LOG="${NISSHI_RUST_LOG:-warn}" exec nohup setsid bash -c \
    'echo $$ >"$0" && exec "$@"' "$NISSHI_PID_FILE" "$NISSHI_BIN" broker \
    --storage-engine "$NISSHI_STORAGE" \
    --listener-url "$BROKER_URL" --advertised-listener-url "$BROKER_URL" \
    </dev/null >>"$NISSHI_LOG" 2>&1 8>&-) &
  local i
  for ((i = 0; i < WAIT_SECS * 4; i++)); do
    if port_open "$BROKER_HOST" "$BROKER_PORT"; then
      broker_alive || die "something else took $BROKER_HOST:$BROKER_PORT while the broker started; see $NISSHI_LOG"
      say "nisshi broker started on $BROKER_HOST:$BROKER_PORT (pid $BROKER_PID, log: .stack/nisshi.log)"
      return 0
    fi
    if [ -f "$NISSHI_PID_FILE" ] && ! broker_alive; then
      die "the nisshi broker exited at startup: $(tail -n "+$from" "$NISSHI_LOG" | { grep '^error:' || tail -n 3; } | tail -n 3 | tr '\n' ' ')(log: $NISSHI_LOG)"
    fi
    sleep 0.25
  done
  die "the nisshi broker did not accept connections on $BROKER_HOST:$BROKER_PORT within ${WAIT_SECS}s; see $NISSHI_LOG"
}

# SIGTERM to the broker in BROKER_PID, SIGKILL if it is still there after 10 s.
stop_broker() {
  say "stopping nisshi broker (pid $BROKER_PID)"
  kill "$BROKER_PID" 2>/dev/null || true
  local i
  for ((i = 0; i < 40; i++)); do pid_running "$BROKER_PID" || break; sleep 0.25; done
  if pid_running "$BROKER_PID"; then
    warn "broker pid $BROKER_PID ignored SIGTERM for 10s; sending SIGKILL"
    kill -9 "$BROKER_PID" 2>/dev/null || true
    while pid_running "$BROKER_PID"; do sleep 0.1; done
  fi
}

create_topic() {
  local out rc=0
  out="$(nisshi timeout 60 topic create "$TOPIC" --partitions "$PARTITIONS" --broker "$BROKER_URL" 2>&1)" || rc=$?
  if [ "$rc" = 0 ]; then
    say "$(last_line "$out")"
  elif [ "$rc" = 124 ]; then
    die "creating topic $TOPIC: the broker on $BROKER_URL did not answer within 60s; see $NISSHI_LOG"
  elif [[ "$out" == *"already exists"* ]]; then
    say "topic $TOPIC already exists"
    # Its partition count, from `nisshi topic list` (a JSON array of Metadata topics).
    if command -v jq >/dev/null 2>&1 && out="$(nisshi timeout 10 topic list --broker "$BROKER_URL" 2>/dev/null)"; then
      local n
      n="$(jq -r --arg t "$TOPIC" '.[] | select(.name == $t) | (.partitions // []) | length' <<<"$out" 2>/dev/null || true)"
      if is_uint "$n" && [ "$n" != "$PARTITIONS" ]; then
        warn "topic $TOPIC has $n partitions, not $PARTITIONS; to change it: nisshi topic delete $TOPIC --broker $BROKER_URL, then scripts/stack.sh up"
      fi
    fi
  else
    # Drop the log prefix ("<time> ERROR nisshi: 150: ") of a Kafka error code's message.
    die "creating topic $TOPIC on $BROKER_URL failed: $(last_line "$out" | sed -E 's/^[^ ]+ +ERROR +[^ ]+ +[0-9]+: +//')"
  fi
}

# ---------------------------------------------------------------- commands

sq() { local q="'\\''"; printf "'%s'" "${1//\'/$q}"; } # single-quotes a value for sh

write_env() {
  local tmp="$ENV_FILE.tmp"
  {
    printf '# Written by scripts/stack.sh up on %s. Source it: . .stack/env\n' "$(date -u +%FT%TZ)"
    printf 'export DATABASE_URL=%s\n' "$(sq "$DB_URL")"
    printf 'export KAFKA_BROKERS=%s\n' "$(sq "$KAFKA")"
    # Marks the values stack.sh chose, so a later `up` from this shell does not take them as user settings.
    if [ "$PG_MODE" != external ]; then printf 'export METERLINE_STACK_DATABASE_URL=%s\n' "$(sq "$DB_URL")"; fi
    if [ "$KAFKA_MODE" != external ]; then printf 'export METERLINE_STACK_KAFKA_BROKERS=%s\n' "$(sq "$KAFKA")"; fi
  } >"$tmp"
  mv "$tmp" "$ENV_FILE"
  {
    printf 'S_PG_MODE=%q\nS_PG_ADDR=%q\nS_DATABASE_URL=%q\n' "$PG_MODE" "$PG_ADDR" "$DB_URL"
    printf 'S_KAFKA_MODE=%q\nS_KAFKA_BROKERS=%q\n' "$KAFKA_MODE" "$KAFKA"
    printf 'S_NISSHI_BIN=%q\nS_NISSHI_STORAGE=%q\n' "$NISSHI_BIN" "$NISSHI_STORAGE"
  } >"$STATE_FILE"
}

lock() {
  mkdir -p "$STACK"
  exec 8>"$STACK/lock"
  flock -w 1200 8 || die "another scripts/stack.sh is still running (lock: $STACK/lock)"
}

cmd_up() {
  lock
  load_state
  choose_postgres
  KAFKA_MODE="" KAFKA=""
  if [ -n "${KAFKA_BROKERS:-}" ] && [ "$KAFKA_BROKERS" != "${METERLINE_STACK_KAFKA_BROKERS:-}" ]; then
    KAFKA_MODE=external KAFKA=$KAFKA_BROKERS
    say "Kafka: using KAFKA_BROKERS=$KAFKA; no broker started, topic $TOPIC not created (create it with $PARTITIONS partitions yourself)"
  else
    KAFKA="$BROKER_HOST:$BROKER_PORT"
    get_nisshi
    ensure_db "$NISSHI_STORAGE" "$ADMIN_URL" nisshi
    if broker_alive; then
      KAFKA_MODE=managed
      say "nisshi broker already running on $KAFKA (pid $BROKER_PID)"
      if [ -n "$S_NISSHI_STORAGE" ] && [ "$S_NISSHI_STORAGE" != "$NISSHI_STORAGE" ]; then
        warn "the running broker stores in $(redact "$S_NISSHI_STORAGE"), not $(redact "$NISSHI_STORAGE"); run scripts/stack.sh down, then up, to switch"
        NISSHI_STORAGE=$S_NISSHI_STORAGE
      fi
    elif port_open "$BROKER_HOST" "$BROKER_PORT"; then
      KAFKA_MODE=reused
      timeout 10 "$NISSHI_BIN" topic list --broker "$BROKER_URL" </dev/null >/dev/null 2>&1 ||
        die "$KAFKA is in use but does not answer Kafka requests; stop that process or set METERLINE_BROKER_PORT"
      say "reusing the Kafka broker already listening on $KAFKA (not started by stack.sh; down leaves it alone)"
    else
      KAFKA_MODE=managed
      start_broker
    fi
    create_topic
  fi
  write_env
  say "up: DATABASE_URL=$(redact "$DB_URL") KAFKA_BROKERS=$KAFKA (source .stack/env)"
}

cmd_down() {
  lock
  load_state
  if broker_alive; then
    stop_broker
  elif [ "$S_KAFKA_MODE" = reused ]; then
    say "leaving the Kafka broker on $S_KAFKA_BROKERS alone (not started by stack.sh)"
  fi
  rm -f "$NISSHI_PID_FILE"
  if [ -f "$PG_DATA/PG_VERSION" ] && find_pg_bin; then
    pick_pg_os_user
    if local_pg_running; then
      say "stopping project-local Postgres (.stack/pg)"
      as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t "$WAIT_SECS" stop >/dev/null 2>&1 ||
        die "the project-local Postgres did not stop; see $PG_LOG"
    fi
  fi
  if [ "$S_PG_MODE" = system ]; then say "leaving the system Postgres on $S_PG_ADDR alone"; fi
  rm -f "$ENV_FILE" "$STATE_FILE"
  say "down"
}

STATUS_RC=0
cmd_status() {
  load_state
  local ok=0 addr note
  if [ -z "$S_PG_MODE" ]; then
    printf 'postgres: not running (stack is not up; run scripts/stack.sh up)\n'; ok=1
  else
    case "$S_PG_MODE" in
      local) note="project-local cluster .stack/pg" ;;
      system) note="system server, not managed by stack.sh" ;;
      *) note="from DATABASE_URL" ;;
    esac
    if command -v pg_isready >/dev/null 2>&1 && pg_isready -q -t 3 -d "$S_DATABASE_URL" >/dev/null 2>&1; then
      printf 'postgres: running at %s (%s)\n' "$S_PG_ADDR" "$note"
    else
      printf 'postgres: NOT running at %s (%s)\n' "$S_PG_ADDR" "$note"; ok=1
    fi
  fi
  if [ -z "$S_KAFKA_MODE" ]; then
    printf 'kafka:    not running (stack is not up; run scripts/stack.sh up)\n'; ok=1
  else
    addr=${S_KAFKA_BROKERS%%,*}
    case "$S_KAFKA_MODE" in
      managed) if broker_alive; then note="nisshi pid $BROKER_PID, log .stack/nisshi.log"; else note="nisshi, started by stack.sh"; fi ;;
      reused) note="broker not started by stack.sh" ;;
      *) note="from KAFKA_BROKERS" ;;
    esac
    if port_open "${addr%:*}" "${addr##*:}"; then
      printf 'kafka:    running at %s (%s)\n' "$S_KAFKA_BROKERS" "$note"
    else
      [ "$S_KAFKA_MODE" = external ] || note="$note; run scripts/stack.sh up"
      printf 'kafka:    NOT running at %s (%s)\n' "$S_KAFKA_BROKERS" "$note"; ok=1
    fi
  fi
  STATUS_RC=$ok
}

# Restarts Postgres in fast mode: every connection is cut, as in a crash of the
# database's clients' view. Only a server this machine runs can be restarted.
cmd_restart_postgres() {
  lock
  load_state
  case "$S_PG_MODE" in
    local)
      find_pg_bin || die "Postgres server binaries not found"
      pick_pg_os_user
      say "restarting the project-local Postgres cluster"
      as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w restart -l "$PG_LOG" >/dev/null 8>&-
      ;;
    system)
      need pg_ctlcluster "install postgresql-common"
      local version
      version=$(ls /etc/postgresql | sort -V | tail -n 1)
      say "restarting the machine's Postgres $version/main"
      pg_ctlcluster --skip-systemctl-redirect "$version" main restart -m fast 8>&-
      ;;
    *) die "no Postgres to restart (postgres: ${S_PG_MODE:-not up}); it is external or the stack is not up" ;;
  esac
  local i
  for i in $(seq 1 100); do
    pg_isready -q -h "${S_PG_ADDR%:*}" -p "${S_PG_ADDR##*:}" && return 0
    sleep 0.1
  done
  die "Postgres did not come back within 10 s"
}

cmd_restart_broker() {
  lock
  load_state
  [ "$S_KAFKA_MODE" = managed ] || die "no broker started by stack.sh to restart (kafka: ${S_KAFKA_MODE:-not up}); run scripts/stack.sh up"
  NISSHI_BIN=$S_NISSHI_BIN NISSHI_STORAGE=$S_NISSHI_STORAGE
  if broker_alive; then
    say "kill -9 nisshi broker (pid $BROKER_PID)"
    kill -9 "$BROKER_PID"
    while pid_running "$BROKER_PID"; do sleep 0.1; done
  fi
  start_broker
}

cmd_stop_broker() {
  lock
  load_state
  [ "$S_KAFKA_MODE" = managed ] || die "no broker started by stack.sh to stop (kafka: ${S_KAFKA_MODE:-not up}); run scripts/stack.sh up"
  if broker_alive; then stop_broker; else say "nisshi broker is not running"; fi
  rm -f "$NISSHI_PID_FILE"
}

cmd_start_broker() {
  lock
  load_state
  [ "$S_KAFKA_MODE" = managed ] || die "no broker started by stack.sh to start (kafka: ${S_KAFKA_MODE:-not up}); run scripts/stack.sh up"
  NISSHI_BIN=$S_NISSHI_BIN NISSHI_STORAGE=$S_NISSHI_STORAGE
  if broker_alive; then
    say "nisshi broker already running on $S_KAFKA_BROKERS (pid $BROKER_PID)"
  else
    start_broker
  fi
}

case "$CMD" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status; exit "$STATUS_RC" ;;
  env) [ -f "$ENV_FILE" ] || die "no .stack/env; run scripts/stack.sh up"; cat "$ENV_FILE" ;;
  restart-broker) cmd_restart_broker ;;
  restart-postgres) cmd_restart_postgres ;;
  stop-broker) cmd_stop_broker ;;
  start-broker) cmd_start_broker ;;
  *) printf 'usage: scripts/stack.sh up|down|status|env|restart-broker|restart-postgres|stop-broker|start-broker\n' >&2; exit 2 ;;
esac
