#!/usr/bin/env bash
# Soak test: mixed traffic (new keys, duplicates, bad input) against the reference receiver
# (examples/receiver.rs) with Postgres and with Redis, for SOAK_SECONDS per store (default 600).
#
#   SOAK_SECONDS=60 scripts/soak.sh
#
# Checks, per store: handler executions == unique valid keys (via GET /effects), no key ran
# twice, no 5xx (none are injected here), and the receiver's RSS sampled every
# SOAK_SAMPLE_SECONDS (default 5) stays flat (first/last/max are printed; the run fails if
# last > 2 x first + 20 MiB). Postgres runs in a throw-away schema of DATABASE_URL's database
# (default postgres://postgres@127.0.0.1:5432/test); Redis is a throw-away redis-server on a
# free loopback port. Everything started here is stopped and removed on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
SOAK_SECONDS=${SOAK_SECONDS:-600}
SAMPLE=${SOAK_SAMPLE_SECONDS:-5}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
SECRET=whsec_soak_$RANDOM$RANDOM
STORES=${SOAK_STORES:-"postgres redis"}

case "$DATABASE_URL" in
    postgres://*@127.0.0.1:*|postgres://*@localhost:*|postgresql://*@127.0.0.1:*) ;;
    *) echo "DATABASE_URL must point at 127.0.0.1" >&2; exit 2 ;;
esac

cargo build --quiet --all-features --example receiver --example soak_client
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
receiver="$target_dir/debug/examples/receiver"
client="$target_dir/debug/examples/soak_client"

work=$(mktemp -d)
pids=()
schema="soak_$$_$RANDOM"
cleanup() {
    for pid in "${pids[@]}"; do
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    psql "$DATABASE_URL" -q -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

soak_one() {
    local name=$1 store=$2
    local log="$work/$name.log"
    RECEIVER_ADDR=127.0.0.1:0 IDEMPOTENCY_STORE=$store STRIPE_WEBHOOK_SECRET=$SECRET \
        HANDLER_DELAY_MS=${SOAK_HANDLER_DELAY_MS:-2} RUST_LOG=warn \
        "$receiver" >"$work/$name.out" 2>"$log" &
    local pid=$!
    pids+=("$pid")
    local base=""
    for _ in $(seq 1 200); do
        base=$(sed -n 's/^listening on //p' "$work/$name.out" | head -n1)
        [ -n "$base" ] && break
        kill -0 "$pid" 2>/dev/null || { echo "$name: receiver exited"; cat "$log"; return 1; }
        sleep 0.05
    done
    [ -n "$base" ] || { echo "$name: receiver did not start"; return 1; }

    "$client" "$base" "$SOAK_SECONDS" "$SECRET" >"$work/$name.result" &
    local client_pid=$!
    pids+=("$client_pid")
    local samples=()
    while kill -0 "$client_pid" 2>/dev/null; do
        samples+=("$(rss_kib "$pid")")
        sleep "$SAMPLE"
    done
    local status=0
    wait "$client_pid" || status=$?
    local first=${samples[0]} last=${samples[-1]} max=0
    for s in "${samples[@]}"; do [ "$s" -gt "$max" ] && max=$s; done
    local warn_5xx
    warn_5xx=$(grep -c 'status=5' "$log" || true)
    echo "$name: $(cat "$work/$name.result")"
    echo "$name: rss_kib first=$first last=$last max=$max samples=${#samples[@]} every=${SAMPLE}s; receiver 5xx log lines=$warn_5xx"
    echo "$name: rss_kib series: ${samples[*]}"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    [ "$status" -eq 0 ] || return 1
    [ "$last" -le $((first * 2 + 20480)) ] || { echo "$name: RSS grew"; return 1; }
}

failed=0
for store in $STORES; do
    case $store in
        postgres)
            psql "$DATABASE_URL" -q -c "CREATE SCHEMA $schema" >/dev/null
            sep='?'; case "$DATABASE_URL" in *\?*) sep='&' ;; esac
            soak_one postgres "${DATABASE_URL}${sep}options=-c%20search_path%3D${schema}" || failed=1
            ;;
        redis)
            port=$(free_port)
            mkdir -p "$work/redis"
            redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
                --dir "$work/redis" --logfile redis.log &
            pids+=("$!")
            for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
            soak_one redis "redis://127.0.0.1:$port" || failed=1
            ;;
        *) echo "unknown store $store" >&2; failed=1 ;;
    esac
done
[ "$failed" -eq 0 ] && echo "soak: PASS (${SOAK_SECONDS}s per store)" || { echo "soak: FAIL"; exit 1; }
