#!/usr/bin/env bash
# Records the public API of every publishable crate as the baseline that `scripts/api-check.sh`
# (and so CI) compares against: api/<crate>.json.gz, the rustdoc JSON without doc comments,
# source positions, the paths of dependency items the crate never names and the file system paths
# of the dependencies' metadata files (the checks need none of them; without the last, the
# baseline is the same whichever directory it is recorded in).
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
# Keep the paths of the crate's own items and of every item they may refer to (any number in the
# index that names a path entry); drop the thousands of unrelated paths of dependencies.
numbers = set()
def collect(value):
    if isinstance(value, dict):
        for inner in value.values():
            collect(inner)
    elif isinstance(value, list):
        for inner in value:
            collect(inner)
    elif isinstance(value, int) and not isinstance(value, bool):
        numbers.add(value)
collect(doc["index"])
for external in doc["external_crates"].values():
    external["path"] = ""
doc["paths"] = {
    key: path for key, path in doc["paths"].items() if key in doc["index"] or int(key) in numbers
}
with gzip.GzipFile(target, "wb", compresslevel=9, mtime=0) as f:
    f.write(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
PY
  echo "api/$crate.json.gz: $(wc -c <"api/$crate.json.gz") bytes"
done
