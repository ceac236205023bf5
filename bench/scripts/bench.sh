#!/usr/bin/env bash
# Runs every benchmark of the workspace and collects the outputs in one directory:
#   - the criterion micro benchmarks (core layer, webhook verification and its paired ratios,
#     sqlx stores, Redis store);
#   - the load harness (bench/loadtest), which also redraws
#     docs/benchmarks/throughput.svg: every store beside the bare handler, its SQL floors and the
#     peer (`idempotent` 2.0, served by bench/peer, built here with
#     --ignore-rust-version: it declares Rust 1.98 and compiles on the project's 1.95);
#   - the transactional mode and the inbox beside their floors (--bin transactional, --bin inbox),
#     MODE_SECONDS (default 3) per cell; the inbox's peer queues are apalis (built into the
#     harness) and graphile-worker (bench/peer-graphile, a Node.js project: needs node 20 or
#     later and npm, installed here with npm ci);
#   - the reference receiver's inbox on SQLite against its synchronous route
#     (bench/scripts/receiver-inbox.sh: wrk and sqlite3).
#
# Usage: bench/scripts/bench.sh [--skip-criterion] [--skip-load] [-- LOADTEST FLAGS...]
#   e.g. bench/scripts/bench.sh -- --duration-ms 3000
#        bench/scripts/bench.sh --skip-criterion -- --quick
# Environment: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test),
#              REDIS_URL (default redis://127.0.0.1:6379). Benchmarks that need an unreachable
#              service print a SKIPPED line and the rest still run.
# Outputs: target/bench-results/<UTC timestamp>/ (criterion-*.txt, loadtest-latest.{json,csv,md},
#          transactional.md, inbox.md, receiver-inbox.md, machine.txt); criterion's own HTML reports stay under
#          target/criterion/.
set -euo pipefail

cd "$(dirname "$0")/../.."
# The bench workspace (bench/Cargo.toml) shares the product workspace's target directory.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
criterion=1
load=1
mode_seconds=${MODE_SECONDS:-3}
while [[ $# -gt 0 ]]; do
    case "$1" in
        --skip-criterion) criterion=0 ;;
        --skip-load) load=0 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "unknown flag $1 (loadtest flags go after --)" >&2; exit 2 ;;
    esac
    shift
done

out="target/bench-results/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpus: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "memory: $(free -m | awk '/Mem:/ {print $2 " MiB"}')"
    echo "kernel: $(uname -r)"
    echo "rustc: $(rustc -V)"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
cat "$out/machine.txt"

if [[ $criterion == 1 ]]; then
    run_bench() {
        local name=$1; shift
        echo "== cargo bench $* (-> $out/criterion-$name.txt)"
        # A missing service makes a bench print SKIPPED; a failing bench should not stop the rest.
        cargo bench "$@" 2>&1 | tee "$out/criterion-$name.txt" || echo "bench $name FAILED" | tee -a "$out/failures.txt"
    }
    run_bench layer -p tower-idempotency-core --bench layer
    run_bench verify -p tower-idempotency-webhooks --bench verify
    run_bench ratios -p tower-idempotency-webhooks --bench ratios
    run_bench stores -p tower-idempotency-sqlx --bench stores
    run_bench redis_store -p tower-idempotency-redis --bench redis_store
fi

if [[ $load == 1 ]]; then
    # apalis-postgres (the inbox's peer queue) checks its queries from the offline data it ships,
    # not against DATABASE_URL's database.
    export SQLX_OFFLINE=true
    echo "== the peer's server (target/peer/release/loadtest-peer)"
    cargo build --release --ignore-rust-version --target-dir target/peer \
        --manifest-path bench/peer/Cargo.toml
    echo "== load harness (-> $out/loadtest-latest.*, docs/benchmarks/throughput.svg)"
    cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin tower-idempotency-loadtest -- \
        --out "$out" --chart docs/benchmarks/throughput.svg "$@" 2> >(tee "$out/loadtest-progress.txt" >&2)
    echo "== the inbox's graphile-worker peer (npm ci --prefix bench/peer-graphile)"
    npm ci --prefix bench/peer-graphile --no-audit --no-fund
    # The transactional mode and the inbox against their own floors (a bare handler writing the
    # same row, and the synchronous webhook layer), in the same run.
    for bin in transactional inbox; do
        echo "== $bin (-> $out/$bin.md)"
        cargo run --release --manifest-path bench/Cargo.toml -p tower-idempotency-loadtest --bin "$bin" -- "$mode_seconds" | tee "$out/$bin.md"
    done
    # The reference receiver on SQLite: its synchronous Stripe route against the inbox's
    # acknowledgements and drain (wrk, 32 connections; needs wrk and sqlite3).
    echo "== receiver-inbox (-> $out/receiver-inbox.md)"
    bench/scripts/receiver-inbox.sh 3 5 | tee "$out/receiver-inbox.md"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
echo "results in $out"
