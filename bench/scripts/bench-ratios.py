#!/usr/bin/env python3
"""Prints the webhook verification bench (crates/tower-idempotency-webhooks/benches/verify.rs)
as a table of provider time / floor time, from criterion's saved samples
(the fastest sample per case, as other load on the machine only ever adds time).

    bench/scripts/bench-ratios.py [baseline]      # default: "new" (the last run)
"""
import json, os, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "criterion")
baseline = sys.argv[1] if len(sys.argv) > 1 else "new"
# Which floor each case is compared with.
FLOOR = {"twilio_form": "floor_hmac_sha1_form", "twilio_json": "floor_sha256_plus_hmac_sha1",
         "discord": "floor_ed25519", "sendgrid": "floor_ecdsa_p256"}

def estimate(group, name):
    base = os.path.join(root, group, name)
    subdirs = [d for d in os.listdir(base)] if os.path.isdir(base) else []
    for sub in subdirs:
        path = os.path.join(base, sub, baseline, "sample.json")
        if os.path.exists(path):
            # The fastest sample: the machine is shared, and interference only adds time.
            with open(path) as f:
                sample = json.load(f)
            return min(t / n for t, n in zip(sample["times"], sample["iters"]))
    return None

def fmt(ns):
    return f"{ns / 1000:.2f} µs" if ns >= 1000 else f"{ns:.0f} ns"

names = None
rows = {}
for size in ("1KiB", "64KiB"):
    group = f"verify_{size}"
    if not os.path.isdir(os.path.join(root, group)):
        continue
    names = sorted(n for n in os.listdir(os.path.join(root, group)) if n != "report")
    for name in names:
        if name.startswith("floor_"):
            continue
        t = estimate(group, name)
        floor_name = FLOOR.get(name, "floor_hmac_sha256")
        f = estimate(group, floor_name)
        if t is None or f is None:
            continue
        rows.setdefault(name, {})[size] = (t, f, floor_name)

print(f"| provider | floor | 1 KiB | floor 1 KiB | ratio | 64 KiB | floor 64 KiB | ratio |")
print("|---|---|---|---|---|---|---|---|")
for name, sizes in rows.items():
    cells = []
    floor_name = None
    for size in ("1KiB", "64KiB"):
        if size in sizes:
            t, f, floor_name = sizes[size]
            cells += [fmt(t), fmt(f), f"{t / f:.2f}x"]
        else:
            cells += ["", "", ""]
    print(f"| {name} | {floor_name.removeprefix('floor_')} | " + " | ".join(cells) + " |")
