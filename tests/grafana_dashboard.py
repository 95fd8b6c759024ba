"""The Grafana dashboard in docs/grafana: the metrics its queries name, and which of them a service's
``/metrics`` text lacks (a metric that exists without samples yet, e.g. a counter nothing incremented,
still counts: its ``# TYPE`` line is there)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "toposm-tiles.json"
# Every metric of ours starts with one of these (PromQL's functions, keywords and label names do not).
PREFIXES = ("toposm_", "spark_bridge_", "qbroker_")
METRIC = re.compile(r"\b(?:" + "|".join(PREFIXES) + r")[a-zA-Z0-9_:]*")
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from exprs(item)


def queried() -> set[str]:
    return {name for expr in exprs(load()) for name in METRIC.findall(expr)}


def exposed(text: str) -> set[str]:
    """Every series name the exposition offers, samples or not."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def missing(prefixes: tuple[str, ...], *texts: str) -> set[str]:
    """The dashboard's metrics starting with one of ``prefixes`` that none of ``texts`` exposes."""
    offered = set().union(*(exposed(text) for text in texts))
    return {name for name in queried() if name.startswith(prefixes)} - offered
