"""docs/metrics.md, where every program's metric names are written once: the names of one program's section,
and the names a ``/metrics`` text offers in the form the docs write them (a counter with ``_total``)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
LIBRARY = "The library's metrics"


def documented(section: str) -> set[str]:
    """The names in the first cell of the table rows under the ``## <section>`` heading."""
    text = DOC.read_text()
    start = text.index(f"\n## {section}")
    end = text.find("\n## ", start + 1)
    rows = [line for line in text[start : end if end >= 0 else None].splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_:]+)`", row.split("|")[1])}


def offered(text: str) -> set[str]:
    return {f.name + "_total" if f.type == "counter" else f.name for f in text_string_to_metric_families(text)}


def own(text: str) -> set[str]:
    """What a program offers of its own: not the library's, not its build info (docs/metrics.md's table of
    programs names those)."""
    return {name for name in offered(text) if not name.startswith("qbroker_") and not name.endswith("_build_info")}
