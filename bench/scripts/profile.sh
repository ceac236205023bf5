#!/usr/bin/env bash
# CPU profiles of the inbox worker draining a backlog alone (bench/loadtest/src/bin/drain.rs), on
# Postgres and on SQLite: `perf record` of the process (DWARF call graphs; the database server is
# another process and is not in them), folded and drawn by inferno into
# docs/benchmarks/drain-postgres.svg and docs/benchmarks/drain-sqlite.svg, and each profile's
# functions by self time into target/bench-results/profile-<UTC timestamp>/<db>-top.txt.
#
# Usage: bench/scripts/profile.sh            (EVENTS=40000 by default)
# Needs: perf (Debian's linux-perf), and inferno (`cargo install inferno`) or Brendan Gregg's
#        FlameGraph scripts (stackcollapse-perf.pl, flamegraph.pl) in FLAMEGRAPH_DIR.
#        DATABASE_URL as for bench.sh.
set -euo pipefail

cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
events=${EVENTS:-40000}
command -v perf > /dev/null || { echo "profile.sh needs perf" >&2; exit 2; }
if command -v inferno-flamegraph > /dev/null; then
    collapse=(inferno-collapse-perf) draw=(inferno-flamegraph)
elif [[ -x "${FLAMEGRAPH_DIR:-}/flamegraph.pl" ]]; then
    collapse=("$FLAMEGRAPH_DIR/stackcollapse-perf.pl") draw=("$FLAMEGRAPH_DIR/flamegraph.pl")
else
    echo "profile.sh needs inferno on the PATH or FLAMEGRAPH_DIR" >&2
    exit 2
fi

SQLX_OFFLINE=true cargo build --release --manifest-path bench/Cargo.toml \
    -p tower-idempotency-loadtest --bin drain
out="target/bench-results/profile-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
for db in postgres sqlite; do
    perf record -F 499 -g --call-graph dwarf,16384 -o "$out/$db.perf" -- \
        "$CARGO_TARGET_DIR/release/drain" "$db" "$events" | tee "$out/$db.txt"
    perf script -i "$out/$db.perf" 2> /dev/null | "${collapse[@]}" > "$out/$db.folded"
    "${draw[@]}" --minwidth 1 --title "inbox worker draining $events events alone, $db" \
        < "$out/$db.folded" > "docs/benchmarks/drain-$db.svg"
    # awk reads the whole report (no early exit for pipefail to see).
    perf report -i "$out/$db.perf" --no-children --sort symbol -g none --stdio 2> /dev/null \
        | awk '!/^#/ && NF && n < 40 { print; n++ }' > "$out/$db-top.txt"
    echo "== $db: the top functions by self time ($out/$db-top.txt)"
    sed -n 1,15p "$out/$db-top.txt"
done
