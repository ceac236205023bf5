#!/usr/bin/env bash
# Fault soak of the durable half: the reference receiver (examples/receiver/) with the webhook
# inbox and the outbox on, under signed Stripe traffic for FAULT_SECONDS (default 600) per
# database while faults are injected at random, then a drain with the faults stopped and the
# invariants checked. The driver is bench/tools/src/bin/faults/ (its doc lists the faults).
#
#   FAULT_SECONDS=120 bench/scripts/faults.sh                 # SQLite, then Postgres
#   FAULT_STORES=postgres FAULT_SEED=42 bench/scripts/faults.sh
#
# SQLite: one instance on a throw-away database file. Postgres: two instances on one
# throw-away schema of DATABASE_URL's database (default postgres://postgres@127.0.0.1:5432/test),
# connected through the test kit's proxy so their connections can be cut. The first half of
# each run has no ordering; the second restarts the instances with INBOX_ORDERING=skip-stale and
# adds ordered events (FAULT_SKIP_STALE=0: no second half). Traffic: new events (plain,
# test.flaky, test.poison, test.permanent, test.outbox), duplicates, concurrent copies,
# forgeries, signed deliveries replayed with a new id in the body, stale timestamps; handlers
# wait 40 ms and 500 ms on Postgres's two instances, 150 ms on SQLite's.
#
# Each run prints its fault log as it goes, then tables of faults per kind, deliveries and
# invariants, and writes summary-<store>.json and fault-log-<store>.txt to FAULT_OUT (default
# target/faults). Exits non-zero on any violation, printing the ids and the fault log around
# them. Every process started here is stopped on exit; everything listens on 127.0.0.1 only.
set -euo pipefail

cd "$(dirname "$0")/../.."
# The bench workspace (bench/Cargo.toml) shares the product workspace's target directory.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
FAULT_SECONDS=${FAULT_SECONDS:-600}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
STORES=${FAULT_STORES:-"sqlite postgres"}
OUT=${FAULT_OUT:-$CARGO_TARGET_DIR/faults}

case "$DATABASE_URL" in
    postgres://*@127.0.0.1:*|postgres://*@localhost:*|postgresql://*@127.0.0.1:*) ;;
    *) echo "DATABASE_URL must point at 127.0.0.1" >&2; exit 2 ;;
esac

cargo build --quiet --all-features --example receiver
cargo build --quiet --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin faults
receiver="$CARGO_TARGET_DIR/debug/examples/receiver"
driver="$CARGO_TARGET_DIR/debug/faults"

work=$(mktemp -d)
mkdir -p "$OUT"
pids=()
schema="faults_$$_$RANDOM"
cleanup() {
    for pid in "${pids[@]}"; do
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    # The driver records every receiver it started; a driver killed here leaves them behind.
    if [ -f "$work/pids" ]; then
        while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done <"$work/pids"
    fi
    psql "$DATABASE_URL" -q -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain -- examples crates src 2>/dev/null)" ]; then commit="$commit+changes"; fi

run_one() { # <name> <db url> <instances>
    FAULT_NAME=$1 FAULT_DB_URL=$2 FAULT_INSTANCES=$3 FAULT_SECONDS=$FAULT_SECONDS \
        FAULT_RECEIVER=$receiver FAULT_OUT="$OUT/$1" FAULT_PIDS="$work/pids" FAULT_COMMIT=$commit \
        "$driver" &
    local pid=$!
    pids+=("$pid")
    local status=0
    wait "$pid" || status=$?
    echo "faults[$1]: instance logs in $OUT/$1"
    return "$status"
}

failed=0
for store in $STORES; do
    case $store in
        sqlite)
            rm -rf "${OUT:?}/sqlite"
            # On a violation the database is kept beside the summary, to be read.
            run_one sqlite "sqlite://$work/faults.db" 1 || { failed=1; cp "$work"/faults.db* "$OUT/sqlite/"; }
            ;;
        postgres)
            rm -rf "${OUT:?}/postgres"
            psql "$DATABASE_URL" -q -c "CREATE SCHEMA $schema" >/dev/null
            sep='?'; case "$DATABASE_URL" in *\?*) sep='&' ;; esac
            run_one postgres "${DATABASE_URL}${sep}options=-c%20search_path%3D${schema}" 2 || failed=1
            ;;
        *) echo "unknown store $store" >&2; failed=1 ;;
    esac
done
[ "$failed" -eq 0 ] && echo "faults: PASS (${FAULT_SECONDS}s per store: $STORES)" || { echo "faults: FAIL"; exit 1; }
