#!/usr/bin/env bash
# The public-API guard: compares every publishable crate's public API (all features) with the
# baseline in api/<crate>.json.gz using cargo-semver-checks, and fails on a change that the
# crates' version does not allow (at 0.1.x, any breaking change; a breaking change passes once the
# version is bumped to 0.2.0). Additions pass.
#
#   scripts/api-check.sh            (needs cargo-semver-checks; .ci/run installs it)
#
# After an intended break is merged, `scripts/api-baseline.sh` records the new baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/api-json.sh

mkdir -p "$api_target/baseline"
status=0
for crate in $(api_crates); do
  baseline="api/$crate.json.gz"
  if [ ! -f "$baseline" ]; then
    echo "$crate: no baseline ($baseline); run scripts/api-baseline.sh"
    status=1
    continue
  fi
  current=$(api_json "$crate")
  gunzip -c "$baseline" >"$api_target/baseline/$crate.json"
  echo "==> $crate"
  cargo semver-checks check-release \
    --baseline-rustdoc "$api_target/baseline/$crate.json" \
    --current-rustdoc "$current" || status=1
done
exit $status
