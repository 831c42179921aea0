#!/usr/bin/env bash
# Installs the outside validators the test suite runs against Meterline's
# own output, each by package name from its registry, only when missing.
# Each tool has its own section; the tests that use one fail (never skip)
# when it is absent.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
APT_UPDATED=""
apt_install() {
  if [ -z "$APT_UPDATED" ]; then
    apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# == promtool (Debian's prometheus package): `promtool check metrics` on every /metrics
if ! command -v promtool >/dev/null 2>&1; then
  # The package also brings a prometheus server unit; only promtool is used.
  apt_install prometheus
fi

# == schemathesis (PyPI): schema-driven testing of billing-api's /openapi.json
# In a virtualenv of its own under the cache (any system Python will do);
# tests/tests/openapi_conformance.rs runs its `st`.
SCHEMATHESIS_VERSION=4.32.5
SCHEMATHESIS_VENV="${METERLINE_CACHE:-$HOME/.cache/meterline}/schemathesis-$SCHEMATHESIS_VERSION"
if ! "$SCHEMATHESIS_VENV/bin/st" --version >/dev/null 2>&1; then
  command -v python3 >/dev/null 2>&1 || apt_install python3
  rm -rf "$SCHEMATHESIS_VENV"
  # Debian's python3 makes a virtualenv only with python3-venv (ensurepip).
  python3 -m venv "$SCHEMATHESIS_VENV" 2>/dev/null || {
    apt_install python3-venv
    rm -rf "$SCHEMATHESIS_VENV"
    python3 -m venv "$SCHEMATHESIS_VENV"
  }
  "$SCHEMATHESIS_VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

# == FOCUS validator (PyPI): the FOCUS exports, CSV and Parquet
# focus-validator 2.2.1 ships the rules of FOCUS 1.2 in its package
# (rules/model-1.2.0.1.json); tests/tests/focus_conformance.rs runs it on
# those with --block-download, so it never fetches rule sets. It needs
# Python >= 3.12 (pyenv's where the system python3 is older), in a
# virtualenv of its own. The engines it validates with are pinned to the
# versions checked here (the newest pyarrow wants numpy 2, which the
# validator refuses). The venv is rebuilt when a pin changes.
FOCUS_VALIDATOR_VERSION=2.2.1
FOCUS_VALIDATOR_PINS="focus-validator==$FOCUS_VALIDATOR_VERSION numpy==1.26.4 pyarrow==21.0.0 \
pandas==2.3.3 polars==1.44.2 duckdb==1.5.6 sqlglot==27.29.0 pandera==0.26.1"
FOCUS_VALIDATOR_VENV="${METERLINE_CACHE:-$HOME/.cache/meterline}/focus-validator-$FOCUS_VALIDATOR_VERSION"
if [ "$(cat "$FOCUS_VALIDATOR_VENV/.installed" 2>/dev/null)" != "$FOCUS_VALIDATOR_PINS" ]; then
  focus_python=""
  for py in python3 python3.13 python3.12 "$(pyenv root 2>/dev/null)"/versions/3.1[2-9]*/bin/python3; do
    if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
      focus_python="$py"
      break
    fi
  done
  if [ -z "$focus_python" ]; then
    echo "error: focus-validator $FOCUS_VALIDATOR_VERSION needs Python >= 3.12 and none was found" >&2
    exit 1
  fi
  rm -rf "$FOCUS_VALIDATOR_VENV"
  "$focus_python" -m venv "$FOCUS_VALIDATOR_VENV"
  # shellcheck disable=SC2086 # one word per requirement
  "$FOCUS_VALIDATOR_VENV/bin/pip" install --quiet --disable-pip-version-check $FOCUS_VALIDATOR_PINS
  printf '%s' "$FOCUS_VALIDATOR_PINS" >"$FOCUS_VALIDATOR_VENV/.installed"
fi

# == openai (PyPI): the official OpenAI Python SDK against gateway-lite
# In a virtualenv of its own under the cache, like schemathesis;
# tests/tests/openai_sdk.rs runs tests/python/openai_sdk_check.py with its
# python. Pinned to the newest 2.x release.
OPENAI_VERSION=2.54.0
OPENAI_VENV="${METERLINE_CACHE:-$HOME/.cache/meterline}/openai-$OPENAI_VERSION"
if ! "$OPENAI_VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" >/dev/null 2>&1; then
  command -v python3 >/dev/null 2>&1 || apt_install python3
  rm -rf "$OPENAI_VENV"
  python3 -m venv "$OPENAI_VENV" 2>/dev/null || {
    apt_install python3-venv
    rm -rf "$OPENAI_VENV"
    python3 -m venv "$OPENAI_VENV"
  }
  "$OPENAI_VENV/bin/pip" install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi

# == nginx (Debian's nginx-light): a reverse proxy in front of the gateway
# Only the binary /usr/sbin/nginx is used, with a config of the test's own;
# no service runs. Debian's package starts one on port 80 where an init
# system is present, so it is stopped right after installing.
if [ ! -x /usr/sbin/nginx ]; then
  apt_install nginx-light
  service nginx stop >/dev/null 2>&1 || /usr/sbin/nginx -s stop >/dev/null 2>&1 || true
fi

# == chromium and chromedriver (Debian's chromium, chromium-driver): a real browser
# tests/tests/billing_browser.rs drives billing-api's pages in headless
# Chromium over WebDriver, starting /usr/bin/chromedriver itself on a free
# port per test (no service runs).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  apt_install chromium chromium-driver
fi
