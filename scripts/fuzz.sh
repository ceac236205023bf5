#!/usr/bin/env bash
# Runs every fuzz target for a fixed time on the stable toolchain (default 10 s each):
#
#   scripts/fuzz.sh [seconds] [target...]
#   SEED=123 scripts/fuzz.sh 30            # reproduce a run (the seed is printed first)
#
# The bodies are the cargo-fuzz targets' (fuzz/src/lib.rs); with a nightly toolchain and
# cargo-fuzz installed, `cd fuzz && cargo +nightly fuzz run <target>` runs them under libFuzzer.
# Failing inputs are saved under fuzz/artifacts/<target>/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-10}"
shift || true
seed="${SEED:-$(date +%s%N)}"
# Share the workspace's target directory: the fuzz crate is its own workspace (not a member of
# the main one) but compiles the same crates.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
cargo build --quiet --manifest-path "$root/fuzz/Cargo.toml" --no-default-features --bin fuzz-stable
exec "$CARGO_TARGET_DIR/debug/fuzz-stable" --seconds "$seconds" --seed "$seed" "$@"
