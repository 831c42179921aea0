#!/usr/bin/env bash
# Builds the Nisshi broker once into a cache outside the checkout and prints its path.
# A cached binary is never rebuilt: the first build takes ~17 minutes on 2 cores.
set -euo pipefail
NISSHI_VERSION="${NISSHI_VERSION:-0.8.1}"
CACHE="${METERLINE_CACHE:-$HOME/.cache/meterline}"
BIN="$CACHE/nisshi-$NISSHI_VERSION/bin/nisshi"
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install the Rust toolchain (rustup) to build the Nisshi broker" >&2
  exit 1
fi
mkdir -p "$CACHE"
LOG="$CACHE/nisshi-build.log"
echo "building nisshi $NISSHI_VERSION once into $CACHE (about 17 minutes; log: $LOG)" >&2
# A lock so two scripts started together don't build it twice.
exec 9>"$CACHE/nisshi-build.lock"
flock 9
if [ ! -x "$BIN" ]; then
  cargo install --locked --ignore-rust-version nisshi --version "$NISSHI_VERSION" \
    --no-default-features --features dynostore,postgres \
    --root "$CACHE/nisshi-$NISSHI_VERSION" >"$LOG" 2>&1 || {
      echo "error: building nisshi failed; the last lines of $LOG:" >&2
      tail -n 30 "$LOG" >&2
      exit 1
    }
fi
echo "$BIN"
