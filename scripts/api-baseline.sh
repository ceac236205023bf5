#!/usr/bin/env bash
# Records the public API of every publishable crate as the baseline that `scripts/api-check.sh`
# (and so CI) compares against: api/<crate>.json.gz, the rustdoc JSON with doc comments and
# source positions left out (the checks need neither).
#
#   scripts/api-baseline.sh
#
# Run it after a release, or after merging a reviewed, intended API break, and commit api/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/api-json.sh

mkdir -p api
rm -f api/*.json.gz
for crate in $(api_crates); do
  json=$(api_json "$crate")
  python3 - "$json" "api/$crate.json.gz" <<'PY'
import gzip, json, sys
source, target = sys.argv[1], sys.argv[2]
with open(source) as f:
    doc = json.load(f)
for item in doc["index"].values():
    item["docs"] = None
    item["span"] = None
with gzip.GzipFile(target, "wb", compresslevel=9, mtime=0) as f:
    f.write(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
PY
  echo "api/$crate.json.gz: $(wc -c <"api/$crate.json.gz") bytes"
done
