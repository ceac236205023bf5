#!/usr/bin/env bash
# Builds the rustdoc JSON of every publishable crate's public API (all features) into
# target/api/doc/<crate>.json, and prints the crate names. Sourced by api-check.sh and
# api-baseline.sh, not run on its own.
#
# Rustdoc's JSON output is unstable: RUSTC_BOOTSTRAP=1 lets the stable toolchain emit it. It is set
# for these rustdoc runs only, in a target directory of their own (target/api), so the main build
# cache is never rebuilt with a different environment.

api_target="${API_TARGET_DIR:-target/api}"

api_crates() {
  cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
meta = json.load(sys.stdin)
print(" ".join(p["name"] for p in meta["packages"] if p.get("publish") != []))'
}

api_json() {
  local crate=$1
  RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$api_target" \
    cargo rustdoc --quiet -p "$crate" --all-features --lib --locked \
    -- -Z unstable-options --output-format json
  echo "$api_target/doc/${crate//-/_}.json"
}
