"""The Grafana dashboard's queries as PromQL, and the metric names a PromQL expression selects."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).parent.parent / "deploy" / "grafana" / "gpuidle.json"

GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
"""Grafana's built-in variables, as a concrete query would have them; dashboard variables become ``.*``."""
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
            "unless", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are no function, keyword or label."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)   # strings
    s = re.sub(r"\{[^}]*\}", " ", s)                                     # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)                                    # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # label lists
    out = set()
    for m in re.finditer(r"(?<![\w:.])[A-Za-z_:][\w:]*", s):
        if m[0] not in KEYWORDS and not s[m.end():].lstrip().startswith("("):
            out.add(m[0])
    return out


def fill_variables(expr: str, builtin: dict[str, str] = GRAFANA_VARIABLES) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: builtin.get(m[1], ".*"), expr)


def all_panels(tree: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for p in tree:
        yield p
        yield from all_panels(p.get("panels", []))


def dashboard_queries(builtin: dict[str, str] = GRAFANA_VARIABLES) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (``label_values(selector, label)``)."""
    doc = json.loads(DASHBOARD.read_text())
    out = [(f"{p['title']} {t['refId']}", fill_variables(t["expr"], builtin))
           for p in all_panels(doc["panels"]) for t in p.get("targets", [])]
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
            assert m, v["query"]
            out.append((f"variable {v['name']}", fill_variables(m[1], builtin)))
    return out


