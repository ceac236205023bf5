#!/usr/bin/env python3
"""Checks the shipped Grafana dashboard and Prometheus alert rules against the crates' metrics.

Usage: scripts/check-observability.py [DASHBOARD_JSON] [ALERT_RULES_YML]
(defaults: docs/grafana/tower-idempotency.json, docs/prometheus/alerts.yml)

- `promtool check rules` on the alert rules, and `promtool test rules` on the rules' unit tests
  (the `.test.yml` beside them, when it exists);
- every PromQL query of the dashboard (panel targets and template variables) parses: they are
  written, with Grafana's variables replaced, into a temporary rules file that promtool checks;
- every metric name those queries and the rules name is one the crates export: the names are read
  from the `pub const NAME: &str = "idempotency_..."` constants the crates register with
  `describe_counter!` / `describe_gauge!` / `describe_histogram!`, so the list cannot drift from the
  sources. A histogram may also be named with the `_bucket`, `_sum` and `_count` suffixes of its
  Prometheus series.

Exits non-zero, naming each problem, when anything is wrong.

The metric names are found with a small tokenizer of PromQL rather than a parser library: no
maintained Python PromQL parser is packaged in Debian, and promtool (which parses) cannot list the
names a query uses.
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import yaml
except ImportError:
    sys.exit("FATAL: PyYAML is missing (Debian: apt-get install python3-yaml)")

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "crates"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

CONST = re.compile(r'pub\s+const\s+([A-Z][A-Z0-9_]*)\s*:\s*&str\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"\s*;')
DESCRIBE = re.compile(r"describe_(counter|gauge|histogram)!\(\s*([A-Z][A-Z0-9_]*)\s*,")

# PromQL words that are not metric names.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile",
}
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor",
    "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_sum", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10",
    "minute", "month", "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort",
    "sort_desc", "sqrt", "time", "timestamp", "vector", "year", "avg_over_time", "min_over_time",
    "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time", "stddev_over_time",
    "stdvar_over_time", "last_over_time", "present_over_time", "acos", "acosh", "asin", "asinh",
    "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad", "pi",
}


def exported_metrics():
    """{name: kind} of every metric constant the crates describe."""
    metrics = {}
    for path in sorted(SOURCES.glob("*/src/**/*.rs")):
        text = path.read_text(encoding="utf-8")
        constants = dict(CONST.findall(text))
        for kind, constant in DESCRIBE.findall(text):
            if constant in constants:
                metrics[constants[constant]] = kind
    return metrics


def allowed_names(metrics):
    names = set(metrics)
    for name, kind in metrics.items():
        if kind == "histogram":
            names.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return names


def strip_nested(text, start, open_char, close_char):
    """Index just past the bracket group that opens at `start`."""
    depth = 0
    i = start
    while i < len(text):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_char}{close_char} in: {text}")


TOKEN = re.compile(r'\s+|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`|#[^\n]*'
                   r"|[a-zA-Z_:][a-zA-Z0-9_:]*|\d[\w.]*|\$\{?\w+\}?|.")
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def metric_names(expr):
    """The metric names a PromQL expression selects (label matchers, grouping label lists, range
    durations and strings are skipped)."""
    names = []
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "{":  # label matchers
            i = strip_nested(expr, i, "{", "}")
            continue
        if ch == "[":  # range or subquery duration
            i = strip_nested(expr, i, "[", "]")
            continue
        match = TOKEN.match(expr, i)
        token = match.group(0)
        i = match.end()
        if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", token):
            lowered = token.lower()
            if lowered in GROUPING:
                # Skip the label list that follows.
                rest = re.match(r"\s*\(", expr[i:])
                if rest:
                    i = strip_nested(expr, i + rest.end() - 1, "(", ")")
                continue
            follows_paren = re.match(r"\s*\(", expr[i:]) is not None
            # An aggregation may be followed by its `by (...)` clause before its parenthesis.
            if lowered in KEYWORDS or lowered in AGGREGATIONS:
                pass
            elif follows_paren and lowered in FUNCTIONS:
                pass
            elif follows_paren:
                names.append(("unknown function", token))
            else:
                names.append(("metric", token))
    return names


def grafana_to_promql(expr):
    """Replaces Grafana's variables so promtool can parse the query."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    expr = re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr)
    return expr


def dashboard_queries(dashboard):
    """(where, PromQL) of every panel target and query template variable."""
    queries = []

    def panels(items):
        for panel in items:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    queries.append((f'panel "{panel.get("title")}" {target.get("refId")}', target["expr"]))
            yield from panels(panel.get("panels", []))
            yield panel

    list(panels(dashboard.get("panels", [])))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query or "")
        if label_values:
            query = label_values.group(1)
        queries.append((f'variable "{variable.get("name")}"', query))
    return queries


def rule_queries(rules):
    queries = []
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            queries.append((f'rule "{name}"', rule["expr"]))
    return queries


def promtool(*args):
    print("+ promtool " + " ".join(args), flush=True)
    return subprocess.run(["promtool", *args]).returncode == 0


def main():
    dashboard_path = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs/grafana/tower-idempotency.json")
    rules_path = Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "docs/prometheus/alerts.yml")
    problems = []

    metrics = exported_metrics()
    if not metrics:
        sys.exit(f"FATAL: no described metric constants found under {SOURCES}")
    print("exported metrics: " + ", ".join(f"{n} ({k})" for n, k in sorted(metrics.items())))
    allowed = allowed_names(metrics)

    if not promtool("check", "rules", str(rules_path)):
        problems.append(f"promtool check rules {rules_path} failed")
    tests = rules_path.with_name(rules_path.stem + ".test.yml")
    if tests.exists():
        if not promtool("test", "rules", str(tests)):
            problems.append(f"promtool test rules {tests} failed")
        for test in yaml.safe_load(tests.read_text(encoding="utf-8")).get("tests", []):
            for series in test.get("input_series", []):
                name = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", series["series"]).group(1)
                if name not in allowed:
                    problems.append(f"{tests}: input series {name}, which no crate exports")

    dashboard = json.loads(dashboard_path.read_text(encoding="utf-8"))
    queries = dashboard_queries(dashboard)
    if not queries:
        problems.append(f"{dashboard_path}: no queries found")
    # promtool parses the dashboard's queries as recording rules.
    with tempfile.TemporaryDirectory() as scratch:
        parsed = Path(scratch) / "dashboard-queries.yml"
        records = [{"record": f"dashboard:query_{i}", "expr": grafana_to_promql(q)} for i, (_, q) in enumerate(queries)]
        parsed.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
        if not promtool("check", "rules", str(parsed)):
            problems.append(f"{dashboard_path}: a query does not parse (see promtool's message above)")

    rules = yaml.safe_load(rules_path.read_text(encoding="utf-8"))
    checked = 0
    for source, entries in ((dashboard_path, queries), (rules_path, rule_queries(rules))):
        for where, query in entries:
            found = metric_names(grafana_to_promql(query))
            if not any(kind == "metric" for kind, _ in found):
                problems.append(f"{source}: {where} names no metric: {query}")
            for kind, name in found:
                checked += 1
                if kind == "unknown function":
                    problems.append(f"{source}: {where} calls an unknown function {name}()")
                elif name not in allowed:
                    problems.append(f"{source}: {where} names {name}, which no crate exports")

    if problems:
        print(f"\nFAIL: {len(problems)} problem(s)")
        for problem in problems:
            print("  " + problem)
        return 1
    print(f"\nOK: {len(queries)} dashboard queries and {len(rule_queries(rules))} rules parse; "
          f"{checked} metric references all name exported metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
