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

# == FOCUS validator (PyPI): the FOCUS exports, CSV and Parquet
