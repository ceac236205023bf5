#!/usr/bin/env bash
# The SQLite store at the low end of its rusqlite range: resolves rusqlite 0.32.1 (and with it
# libsqlite3-sys 0.30, the oldest sqlx-sqlite 0.9 accepts) and runs the SQLite store's tests.
# Cargo.lock (which holds the high end, rusqlite 0.43) is put back afterwards.
#
#   scripts/rusqlite-low.sh
set -euo pipefail
cd "$(dirname "$0")/.."
backup=$(mktemp)
cp Cargo.lock "$backup"
trap 'cp "$backup" Cargo.lock; rm -f "$backup"' EXIT
cargo update --quiet -p rusqlite --precise 0.32.1
grep -A1 '^name = "libsqlite3-sys"$' Cargo.lock | grep -q '^version = "0.30' \
  || { echo "FATAL: rusqlite 0.32 did not resolve libsqlite3-sys 0.30"; exit 1; }
cargo test -p tower-idempotency-sqlx --features sqlite --test sqlite
