#!/usr/bin/env bash
# The reference receiver (examples/receiver/) on SQLite, as a user runs it: wrk (one thread, 32
# connections) sends new signed Stripe events, first to the synchronous route
# (`POST /webhooks/stripe`), then, on a fresh database, to the inbox (`POST /inbox/stripe`) while
# its worker drains them (handler without delay). Prints each run's rate and p99, the inbox's
# drain over the same window (events processed by the window's end), and the ratios the inbox
# is held to: acknowledgements and drain against the synchronous route.
#
# Usage: bench/scripts/receiver-inbox.sh [ROUNDS] [SECONDS]   (default 2 rounds of 5 s)
# Environment: RECEIVERS, a space-separated list of receiver binaries to compare in the same run
#              (default: the one built here); PORT (default 3917, loopback only).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
rounds=${1:-2}
seconds=${2:-5}
port=${PORT:-3917}
secret=whsec_receiver_bench
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 2; }
command -v sqlite3 >/dev/null || { echo "sqlite3 is needed (apt-get install sqlite3)" >&2; exit 2; }

if [[ -z "${RECEIVERS:-}" ]]; then
    cargo build --release --example receiver --all-features
    RECEIVERS="$CARGO_TARGET_DIR/release/examples/receiver"
fi
cargo build --release --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin signed_events
signed="$CARGO_TARGET_DIR/release/signed_events"

dir=$(mktemp -d)
pid=
stop() {
    if [[ -n "$pid" ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; fi
}
trap 'stop; rm -rf "$dir"' EXIT

ALONE_SECONDS=3
count_processed() {
    sqlite3 "$dir/receiver.db" "SELECT count(*) FROM webhook_inbox WHERE state = 1"
}

# One run: a fresh database and receiver, wrk on ROUTE; prints "rps p99_ms errors processed
# alone" (alone: the inbox's drain per second over the next 3 s, with nothing arriving).
run() {
    local receiver=$1 route=$2 label=$3
    stop
    rm -f "$dir"/receiver.db*
    "$signed" "$secret" 400000 "evt_${label}" > "$dir/events.tsv"
    RECEIVER_ADDR="127.0.0.1:$port" IDEMPOTENCY_STORE="sqlite://$dir/receiver.db" \
        STRIPE_WEBHOOK_SECRET="$secret" RUST_LOG=warn "$receiver" > "$dir/receiver.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 200); do
        curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.05
    done
    local result
    result=$(EVENTS="$dir/events.tsv" wrk -t1 -c32 -d"${seconds}s" -s bench/scripts/wrk/stripe.lua \
        "http://127.0.0.1:$port" -- "$route" | grep '^RESULT')
    local processed=0 alone=0
    if [[ $route == /inbox/stripe ]]; then
        processed=$(count_processed)
        # The worker alone on the backlog left, nothing arriving: its drain without deliveries.
        sleep "$ALONE_SECONDS"
        alone=$(( ( $(count_processed) - processed ) / ALONE_SECONDS ))
    fi
    stop
    local rps p99 errors
    rps=$(sed -E 's/.* rps=([0-9.]+).*/\1/' <<<"$result")
    p99=$(sed -E 's/.* p99_ms=([0-9.]+).*/\1/' <<<"$result")
    errors=$(sed -E 's/.* errors=([0-9]+).*/\1/' <<<"$result")
    echo "$rps $p99 $errors $processed $alone"
}

echo "| receiver | round | sync req/s | sync p99 ms | inbox acks/s | acks p99 ms | drain/s | drain alone/s | acks / sync | drain / sync | drain alone / sync | errors |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
    for receiver in $RECEIVERS; do
        read -r sync_rps sync_p99 sync_errors _ < <(run "$receiver" /webhooks/stripe "s${round}$RANDOM")
        read -r acks acks_p99 ack_errors processed alone < <(run "$receiver" /inbox/stripe "i${round}$RANDOM")
        drain=$(awk -v n="$processed" -v s="$seconds" 'BEGIN { printf "%.0f", n / s }')
        awk -v r="$receiver" -v round="$round" -v s="$sync_rps" -v sp="$sync_p99" -v a="$acks" \
            -v ap="$acks_p99" -v d="$drain" -v al="$alone" -v e="$((sync_errors + ack_errors))" \
            'BEGIN { printf "| %s | %d | %.0f | %.1f | %.0f | %.1f | %s | %s | %.2f | %.3f | %.3f | %d |\n", r, round, s, sp, a, ap, d, al, a / s, d / s, al / s, e }'
    done
done
