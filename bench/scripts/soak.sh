#!/usr/bin/env bash
# Soak test: mixed traffic (new keys, duplicates, bad input) against the reference receiver
# (examples/receiver/) with Postgres and with Redis, for SOAK_SECONDS per store (default 600),
# then a "flat" phase of SOAK_FLAT_SECONDS (default 300; 0 skips it) with only duplicates of the
# keys already completed and bad input: no new key.
#
#   SOAK_SECONDS=60 SOAK_FLAT_SECONDS=60 bench/scripts/soak.sh
#   SOAK_STORES=redis bench/scripts/soak.sh & SOAK_STORES=postgres bench/scripts/soak.sh   # in parallel
#
# Checks, per store: handler executions == unique valid keys (via GET /effects), no key ran
# twice, no 5xx (none are injected here), the flat phase adds no execution and every duplicate
# in it is a replay. The receiver's RSS is sampled every SOAK_SAMPLE_SECONDS (default 5) and
# reported per phase (first/last/max). In the mixed phase it grows by design: the receiver keeps
# one GET /effects entry per executed key, so the growth per unique key is printed. In the flat
# phase nothing may grow: the run fails if any of its samples exceeds its first by more than
# SOAK_FLAT_TOLERANCE_KIB (default 2048). Postgres runs in a throw-away schema of DATABASE_URL's
# database (default postgres://postgres@127.0.0.1:5432/test); Redis is a throw-away redis-server
# on a free loopback port. Everything started here is stopped and removed on exit.
set -euo pipefail

cd "$(dirname "$0")/../.."
# The bench workspace (bench/Cargo.toml) shares the product workspace's target directory.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
SOAK_SECONDS=${SOAK_SECONDS:-600}
SAMPLE=${SOAK_SAMPLE_SECONDS:-5}
FLAT_SECONDS=${SOAK_FLAT_SECONDS:-300}
FLAT_TOLERANCE=${SOAK_FLAT_TOLERANCE_KIB:-2048}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
SECRET=whsec_soak_$RANDOM$RANDOM
STORES=${SOAK_STORES:-"postgres redis"}

case "$DATABASE_URL" in
    postgres://*@127.0.0.1:*|postgres://*@localhost:*|postgresql://*@127.0.0.1:*) ;;
    *) echo "DATABASE_URL must point at 127.0.0.1" >&2; exit 2 ;;
esac

cargo build --quiet --all-features --example receiver
cargo build --quiet --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin soak_client
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
receiver="$target_dir/debug/examples/receiver"
client="$target_dir/debug/soak_client"

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
# Prints "first last max" of its arguments.
stats() {
    [ "$#" -gt 0 ] || { echo "0 0 0"; return; }
    local max=0 s
    for s in "$@"; do [ "$s" -gt "$max" ] && max=$s; done
    echo "${1:-0} ${!#:-0} $max"
}

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

    local started=$SECONDS
    # The idle receiver's RSS is where the mixed phase starts from.
    local mixed=("$(rss_kib "$pid")") flat=() before after rss load_mixed="" load_flat=""
    "$client" "$base" "$SOAK_SECONDS" "$SECRET" "$FLAT_SECONDS" >"$work/$name.result" &
    local client_pid=$!
    pids+=("$client_pid")
    # A sample counts for a phase only when the phase is the same just before and after it.
    phase() { sed -n 's/^phase //p' "$work/$name.result" | tail -n1; }
    while kill -0 "$client_pid" 2>/dev/null; do
        before=$(phase)
        rss=$(rss_kib "$pid")
        after=$(phase)
        if [ "$before" = "$after" ]; then
            case $after in
                mixed) mixed+=("$rss"); load_mixed=$(cut -d' ' -f1-3 /proc/loadavg) ;;
                flat) flat+=("$rss"); load_flat=$(cut -d' ' -f1-3 /proc/loadavg) ;;
            esac
        fi
        sleep "$SAMPLE"
    done
    local status=0
    wait "$client_pid" || status=$?
    local warn_5xx
    warn_5xx=$(grep -c 'status=5' "$log" || true)
    local summary
    summary=$(grep -E '^(PASS|FAIL)' "$work/$name.result" || echo "FAIL no summary")
    echo "$name: $summary"
    echo "$name: ran $((SECONDS - started))s (${SOAK_SECONDS}s mixed + ${FLAT_SECONDS}s flat + checks); receiver 5xx log lines=$warn_5xx"
    local m_first m_last m_max f_first f_last f_max keys
    read -r m_first m_last m_max <<<"$(stats "${mixed[@]}")"
    keys=$(sed -n 's/.*unique_valid_keys=\([0-9]*\).*/\1/p' <<<"$summary")
    echo "$name: mixed rss_kib first=$m_first last=$m_last max=$m_max samples=${#mixed[@]} every=${SAMPLE}s;" \
        "growth per unique key=$(( keys > 0 ? (m_last - m_first) * 1024 / keys : 0 )) bytes" \
        "over ${keys:-0} keys (the receiver's /effects map); load average at end: $load_mixed"
    echo "$name: mixed rss_kib series: ${mixed[*]}"
    if [ "$FLAT_SECONDS" -gt 0 ]; then
        read -r f_first f_last f_max <<<"$(stats "${flat[@]}")"
        echo "$name: flat rss_kib first=$f_first last=$f_last max=$f_max samples=${#flat[@]};" \
            "last-first=$((f_last - f_first)) KiB, max-first=$((f_max - f_first)) KiB (tolerance ${FLAT_TOLERANCE}); load average at end: $load_flat"
        echo "$name: flat rss_kib series: ${flat[*]}"
    fi
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    [ "$status" -eq 0 ] || return 1
    if [ "$FLAT_SECONDS" -gt 0 ]; then
        [ "${#flat[@]}" -ge 2 ] || { echo "$name: too few flat-phase RSS samples"; return 1; }
        [ "$((f_max - f_first))" -le "$FLAT_TOLERANCE" ] || { echo "$name: RSS grew without new keys"; return 1; }
    fi
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
[ "$failed" -eq 0 ] && echo "soak: PASS (${SOAK_SECONDS}s mixed + ${FLAT_SECONDS}s flat per store)" || { echo "soak: FAIL"; exit 1; }
