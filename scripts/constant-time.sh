#!/usr/bin/env bash
# Checks that rejecting a wrong webhook signature costs the same whether it is wrong in its
# first or its last hex digit (Stripe HMAC, GitLab token), by counting executed instructions
# with callgrind: counts are exact and repeatable, unlike wall-clock timings on a busy machine.
#
# Usage: scripts/constant-time.sh [--self-check]
#   (default)     the Stripe and GitLab head/tail pairs must have IDENTICAL counts, then the
#                 self-check below runs too, so every pass carries its own proof of sensitivity;
#   --self-check  only the sensitivity check: a deliberately early-exit byte comparison in the
#                 probe (naive-head-/naive-tail-) must show DIFFERENT counts.
# Exit status: 0 pass, 1 a check failed, 2 usage or environment error.
#
# Only the probe's `ct_probe_measure` (N verifications of one fixed delivery) is counted
# (--toggle-collect): the modes' setup differs by design (which digit is changed), and counting
# the whole process would mix that in. Under valgrind, address layout, environment and argv
# (all mode names have 11 bytes) are identical between runs, so no tolerance is needed: the
# comparison is exact, and any extra instruction per call shows up N-fold.
# Workload: bench/tools/src/bin/ct_probe.rs.
set -euo pipefail

cd "$(dirname "$0")/.."
# The bench workspace (bench/Cargo.toml) shares the product workspace's target directory.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
self_check_only=0
case "${1:-}" in
    "") ;;
    --self-check) self_check_only=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
esac
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }

cargo build --release --quiet --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin ct_probe
probe="${CARGO_TARGET_DIR:-target}/release/ct_probe"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Instructions executed inside ct_probe_measure for one mode.
count() {
    local mode=$1 out="$work/$1.out"
    if ! env -i PATH="$PATH" valgrind --tool=callgrind --toggle-collect=ct_probe_measure \
        --callgrind-out-file="$out" "$probe" "$mode" >"$work/$mode.log" 2>&1; then
        cat "$work/$mode.log" >&2
        echo "probe failed for $mode" >&2
        exit 2
    fi
    local n
    n=$(awk '/^summary:/ { print $2 }' "$out")
    # A symbol-name mismatch would count nothing and make every pair "equal".
    if [[ -z "$n" || "$n" -lt 10000 ]]; then
        echo "callgrind counted ${n:-nothing} for $mode: is ct_probe_measure still the symbol?" >&2
        exit 2
    fi
    echo "$n"
}

status=0
same() {
    local name=$1 head tail
    head=$(count "$name-head")
    tail=$(count "$name-tail")
    if [[ "$head" == "$tail" ]]; then
        printf 'ok    %-7s wrong first digit %12s, wrong last digit %12s instructions (identical)\n' \
            "$name" "$head" "$tail"
    else
        printf 'FAIL  %-7s wrong first digit %12s, wrong last digit %12s instructions (differ by %d)\n' \
            "$name" "$head" "$tail" "$((tail - head))"
        status=1
    fi
}

if [[ $self_check_only == 0 ]]; then
    same stripe
    same gitlab
    for name in stripe gitlab; do
        good=$(count "$name-good")
        printf 'info  %-7s correct signature %12s instructions\n' "$name" "$good"
    done
fi

head=$(count naive-head-)
tail=$(count naive-tail-)
if [[ "$head" != "$tail" ]]; then
    printf 'ok    self-check: early-exit comparison %s vs %s instructions (leak detected)\n' \
        "$head" "$tail"
else
    printf 'FAIL  self-check: early-exit comparison %s vs %s instructions: the method cannot see a leak\n' \
        "$head" "$tail"
    status=1
fi
exit "$status"
