#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

Usage: scripts/module-cycles.py [--allow CRATE_SRC_DIR=MODULE,MODULE...]... CRATE_SRC_DIR...

Reads the `use` declarations and the `crate::`/`super::` paths of every file (one module per
file, `#[cfg(test)] mod tests` and comments skipped), builds the graph of which module uses which, and prints
every strongly connected component of more than one module. `--allow` names one circle that
is accepted in a crate, exactly: the run fails if that circle gains a module, or if it is gone
(so that a removed exception is also removed from the call). Hand-written rather than a crate:
the graph needs only the paths, and no maintained tool reports module-level cycles of a crate.
"""
import os
import re
import sys


def modules(root):
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".rs"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, root)[:-3].split("/")
                if parts[-1] in ("mod", "lib", "main"):
                    parts = parts[:-1]
                found["::".join(parts)] = path
    return found


def resolve(mods, current, segments):
    """The module a path names (its longest prefix that is a module), or None."""
    if segments[0] == "crate":
        base, rest = [], segments[1:]
    elif segments[0] in ("super", "self"):
        base, rest = list(current), segments
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    else:
        return None
    for end in range(len(rest), -1, -1):
        candidate = "::".join(base + rest[:end])
        if candidate in mods:
            return candidate
    return None


def expand(tree):
    """`a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0 or not tree.endswith("}"):
        return [tree.split(" as ")[0].strip()]
    prefix = tree[:brace].rstrip(":")
    items, depth, item = [], 0, ""
    for char in tree[brace + 1 : -1]:
        depth += char == "{"
        depth -= char == "}"
        if char == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += char
    items.append(item)
    paths = []
    for item in filter(str.strip, items):
        for path in expand(item):
            paths.append(f"{prefix}::{path}" if prefix else path)
    return paths


def graph(root):
    mods = modules(root)
    edges = {module: set() for module in mods}
    for module, path in mods.items():
        source = open(path, encoding="utf-8").read()
        source = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", source, flags=re.S)
        # Comments (doc links included) name modules without importing them.
        source = re.sub(r"//.*$", "", source, flags=re.M)
        current = module.split("::") if module else []
        paths = []
        for tree in re.findall(r"^\s*(?:pub(?:\([\w ]+\))?\s+)?use\s+([^;]+);", source, re.M):
            paths += expand(tree.replace("\n", " "))
        paths += re.findall(r"\b((?:crate|super)(?:::\w+)+)", source)
        for used in paths:
            segments = [s for s in used.split("::") if s]
            target = segments and resolve(mods, current, segments)
            # A module's own ancestors (its parent's re-exports) are not an import circle.
            if target and target != module and not module.startswith(target + "::"):
                edges[module].add(target)
    return edges


def components(edges):
    """Tarjan's strongly connected components."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in edges:
        if node not in index:
            visit(node)
    return found


def arguments(argv):
    """The crate folders, and the accepted circle of each folder that has one."""
    roots, allowed = [], {}
    args = iter(argv)
    for arg in args:
        if arg == "--allow":
            root, _, members = next(args).partition("=")
            allowed[root] = sorted(members.split(","))
        else:
            roots.append(arg)
    return roots, allowed


def main():
    roots, allowed = arguments(sys.argv[1:])
    failed = False
    for root in roots:
        edges = graph(root)
        found_allowed = False
        for component in components(edges):
            if len(component) < 2:
                continue
            if component == allowed.get(root):
                found_allowed = True
                print(f"{root}: accepted import circle through {', '.join(component)}")
                continue
            failed = True
            print(f"{root}: import circle through {', '.join(component)}")
            for module in component:
                inside = sorted(t for t in edges[module] if t in component)
                print(f"    {module} -> {', '.join(inside)}")
        if root in allowed and not found_allowed:
            failed = True
            print(f"{root}: the accepted circle {', '.join(allowed[root])} is gone; drop its --allow")
    for root in allowed:
        if root not in roots:
            failed = True
            print(f"{root}: --allow names a folder that is not checked")
    if failed:
        sys.exit(1)
    accepted = " beyond the accepted ones" if allowed else ""
    print(f"no import circle in {', '.join(roots)}{accepted}")


if __name__ == "__main__":
    main()
