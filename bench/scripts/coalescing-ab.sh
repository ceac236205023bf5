#!/usr/bin/env bash
# The coalescing A/B as a new user would run it: the `orders` server (bench/tools, an axum
# `POST /orders` answering 201 at once behind the client-key layer) on each Postgres store, and
# wrk (Debian's package) with one thread and 32 connections for 5 s, on new keys and on hot keys
# (every 16 consecutive requests share one), the targets in turn, alternating their order each
# round. Prints one line per target, load and round: requests/s, p99, non-2xx answers.
#
#   bench/scripts/coalescing-ab.sh [ROUNDS] [TARGETS...]   (default: 2, pool32 pool32-coalescing default default-coalescing bare)
#
# Postgres is DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test). Honours
# CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pool32 pool32-coalescing default default-coalescing bare)
command -v wrk >/dev/null || { echo "FATAL: wrk is not installed (Debian package wrk)"; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --quiet --release --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin orders
server_bin="$CARGO_TARGET_DIR/release/orders"
lua="$PWD/bench/scripts/wrk/orders.lua"

server=""
stop() { [ -z "$server" ] || { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; server=""; }; }
trap stop EXIT

printf '%-18s %-4s %5s %12s %10s %8s\n' target load round req/s p99 non-2xx
for round in $(seq 1 "$rounds"); do
  order=("${targets[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    order=(); for ((i = ${#targets[@]} - 1; i >= 0; i--)); do order+=("${targets[$i]}"); done
  fi
  for target in "${order[@]}"; do
    fifo=$(mktemp -u); mkfifo "$fifo"
    "$server_bin" "$target" >"$fifo" &
    server=$!
    read -r _ _ addr <"$fifo"
    rm -f "$fifo"
    for load in new hot; do
      errors=$(mktemp)
      out=$(wrk -t1 -c32 -d5s --latency -s "$lua" "http://$addr/orders" -- "$load" "r$round-$target-$RANDOM$RANDOM" 2>"$errors")
      # wrk reports a broken script on stderr and still runs (with GET requests): stop there.
      if [ -s "$errors" ]; then cat "$errors" >&2; rm -f "$errors"; exit 1; fi
      rm -f "$errors"
      rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
      p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
      non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
      printf '%-18s %-4s %5s %12s %10s %8s\n' "$target" "$load" "$round" "$rps" "$p99" "${non2xx:-0}"
    done
    stop
  done
done
