#!/usr/bin/env python3
"""Checks that every publishable crate's `rust-version` is at least the highest `rust-version`
any of its normal or build dependencies declares (all features on, as the lockfile resolves them).

A crate that claims an older Rust than a dependency needs cannot be built with that Rust, so the
claim would be false. Clippy's `incompatible_msrv` lint covers the other half: the crates' own use
of standard-library APIs newer than the claim.

Usage: scripts/msrv.py   (from anywhere in the workspace; exits 1 on a false claim)
"""
import json
import subprocess
import sys


def version(text):
    """`text` as (major, minor, patch): "1.94" and "1.94.0" are the same version."""
    parts = [int(part) for part in text.split(".")] if text else []
    return tuple((parts + [0, 0, 0])[:3])


def main():
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"]
        )
    )
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    failed = False
    for root in meta["workspace_members"]:
        package = packages[root]
        if package.get("publish") == []:
            continue
        claimed = package.get("rust_version")
        seen, stack = set(), [root]
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            for dep in nodes[current]["deps"]:
                if all(kind["kind"] == "dev" for kind in dep["dep_kinds"]):
                    continue
                stack.append(dep["pkg"])
        seen.discard(root)
        needed, name = max(
            (version(packages[i].get("rust_version")), f'{packages[i]["name"]} {packages[i]["version"]}')
            for i in seen
        )
        needed_text = ".".join(map(str, needed))
        if claimed is None or version(claimed) < needed:
            print(f'{package["name"]}: rust-version {claimed} is older than {needed_text}, which {name} needs')
            failed = True
        else:
            print(f'{package["name"]}: rust-version {claimed}; highest a dependency needs: {needed_text} ({name})')
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
