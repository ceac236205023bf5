#!/usr/bin/env bash
# Instructions per webhook verification, per provider, counted by callgrind: the repeatable
# companion to the paired-ratio bench (`cargo bench --bench ratios`), whose wall-clock ratios
# move by several points between runs on a shared 2-core machine. Prints, per case, all
# instructions per verification and those outside the hash compression functions (SHA-1,
# SHA-256, SHA-512): the second is the parsing, decoding and bookkeeping that code changes move.
#
# Usage: bench/scripts/verify-instructions.sh [BODY_BYTES] [CASE ...]
#   BODY_BYTES  default 1024; CASEs default to the HMAC providers of benches/common.
# Honours CARGO_TARGET_DIR. Counting runs under valgrind with the software SHA code (valgrind
# does not offer the SHA extensions), so the hash share is larger than on the bare CPU; the
# non-hash column is what compares across commits.
# Workload: bench/tools/src/bin/verify_loop.rs.
set -euo pipefail

cd "$(dirname "$0")/../.."
# The bench workspace (bench/Cargo.toml) shares the product workspace's target directory.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
size="${1:-1024}"
shift || true
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
    cases=(stripe stripe_id_first github shopify standard_webhooks generic_hmac square paddle
           slack linear zoom)
fi

cargo build --release --quiet --manifest-path bench/Cargo.toml -p tower-idempotency-tools --bin verify_loop
bin="${CARGO_TARGET_DIR:-target}/release/verify_loop"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# The verifier type whose `verify` is counted (--toggle-collect), so the set-up is not.
verifier_of() {
    case "$1" in
        stripe*) echo StripeVerifier ;;
        github) echo GitHubVerifier ;;
        shopify) echo ShopifyVerifier ;;
        standard_webhooks) echo StandardWebhooksVerifier ;;
        generic_hmac | generic_json_pointer) echo HmacVerifier ;;
        square) echo SquareVerifier ;;
        paddle) echo PaddleVerifier ;;
        slack) echo SlackVerifier ;;
        linear) echo LinearVerifier ;;
        zoom) echo ZoomVerifier ;;
        mailgun) echo MailgunVerifier ;;
        twilio*) echo TwilioVerifier ;;
        *) echo "no verifier known for case $1" >&2; exit 2 ;;
    esac
}

count=1000
echo "| case | instructions / verification | outside SHA compression |"
echo "|---|---|---|"
for case in "${cases[@]}"; do
    verifier="$(verifier_of "$case")"
    valgrind --tool=callgrind --callgrind-out-file="$out/$case" \
        --toggle-collect="*$verifier as tower_idempotency_webhooks::verifier::Verifier>::verify" \
        "$bin" "$case" "$size" "$count" >/dev/null 2>&1
    callgrind_annotate "$out/$case" 2>/dev/null | awk -v name="$case" -v n="$count" '
        /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
        /compress(256|512)?[^a-z_]|sha1::compress/ && !/PROGRAM/ { gsub(",", "", $1); hash += $1 }
        END { printf "| %s | %d | %d |\n", name, total / n, (total - hash) / n }'
done
