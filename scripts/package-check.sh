#!/usr/bin/env bash
# The packaging dry run: `cargo package` of every publishable crate (those without
# `publish = false`) in dependency order, each then built from its package alone against the
# packages before it, as crates.io would see it (nothing is uploaded). Then fails when a package
# holds more than a user needs: only the crate's sources, its README, the changelog, the licence
# texts and the files cargo adds itself are allowed (no benches, tests, fuzz corpora, data files
# or target directories).
#
#   scripts/package-check.sh            (run from anywhere in the workspace)
#
# Uncommitted changes are packaged too (--allow-dirty) so the script also runs on a work tree.
set -euo pipefail
cd "$(dirname "$0")/.."

allowed='^(src/.*\.rs|README\.md|CHANGELOG\.md|LICENSE-MIT|LICENSE-APACHE|Cargo\.toml|Cargo\.toml\.orig|Cargo\.lock|\.cargo_vcs_info\.json)$'
dirty=()
[ -z "$(git status --porcelain 2>/dev/null)" ] || dirty=(--allow-dirty)

crates=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
meta = json.load(sys.stdin)
print(" ".join(p["name"] for p in meta["packages"] if p.get("publish") != []))')

# The packages are verified in a target directory of their own, emptied first: cargo keys a
# registry crate's build by its name and version, so a target directory that built an earlier
# package of the same version would link the next crate against that stale build.
export CARGO_TARGET_DIR="$PWD/target/package-check"
rm -rf "$CARGO_TARGET_DIR"
# Nothing else reads those builds: their disk is given back when the check ends.
trap 'rm -rf "$CARGO_TARGET_DIR"' EXIT

# cargo extracts the packages it verifies under $CARGO_HOME/registry/src/<hash of its temporary
# registry's path>/<name>-<version> and reuses an extraction it finds there, so a second run from
# the same directory would build one crate against another's previous package. Clear ours first.
for crate in $crates; do
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/"$crate"-[0-9]*
done

package_args=()
for crate in $crates; do package_args+=(-p "$crate"); done
cargo package --locked "${dirty[@]}" "${package_args[@]}"

status=0
for crate in $crates; do
  files=$(cargo package -p "$crate" --list --locked "${dirty[@]}" 2>/dev/null)
  extra=$(grep -Ev "$allowed" <<<"$files" || true)
  for required in README.md LICENSE-MIT LICENSE-APACHE; do
    grep -qx "$required" <<<"$files" || { echo "$crate: the package lacks $required"; status=1; }
  done
  if [ -n "$extra" ]; then
    echo "$crate: the package holds files it does not need:"
    sed 's/^/  /' <<<"$extra"
    status=1
  else
    echo "$crate: $(wc -l <<<"$files") files, all needed"
  fi
done
exit $status
