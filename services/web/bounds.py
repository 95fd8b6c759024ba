"""Bounds on what the bus hands toposm-web for its metrics and status page.

Label values and keys come from other processes (dead-letter reasons, render thread names, job states,
zooms): one unit answering ``qbroker.ping`` with 50,000 dead-letter keys made 50,005 Prometheus series and
a 1.6 MB status pushed to every live page. So every such label keeps its ``MAX_LABEL_VALUES`` largest
values plus ``other`` (the sum of the rest), every text is cut to ``MAX_TEXT`` characters with its control
characters replaced, and every structure the page shows is clipped in depth and length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qbroker.printable import CONTROL_CHARACTERS

MAX_LABEL_VALUES = 20
MAX_TEXT = 120
MAX_ITEMS = 50
MAX_DEPTH = 4
OTHER = "other"
# Shown as '?', never passed on (a label value or page text must not carry terminal codes).
_CONTROLS = dict.fromkeys(CONTROL_CHARACTERS, "?")


def clean(value: object, limit: int = MAX_TEXT) -> str:
    """``value`` as one line of at most ``limit`` characters, without control characters."""
    text = str(value).translate(_CONTROLS)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def as_count(value: object) -> int:
    """A counter from the bus as an int: anything that is not a finite number counts as 0 (a forged stats
    answer must not turn the status page into a 500)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        return 0
    return int(value)


def records(value: object) -> list[Mapping[str, Any]]:
    """The objects of a list from the bus, at most ``MAX_ITEMS``; anything else in it is left out."""
    return [item for item in value[:MAX_ITEMS] if isinstance(item, Mapping)] if isinstance(value, list) else []


def top_n(counts: Mapping[Any, float], n: int = MAX_LABEL_VALUES) -> dict[str, float]:
    """The ``n`` largest counts under clean keys, the rest summed under ``other``."""
    merged: dict[str, float] = {}
    for key, value in counts.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            name = clean(key)
            merged[name] = merged.get(name, 0) + value
    ranked = sorted(merged.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ranked[:n])
    if len(ranked) > n:
        kept[OTHER] = kept.get(OTHER, 0) + sum(value for _, value in ranked[n:])
    return kept


def clip(value: Any, depth: int = MAX_DEPTH) -> Any:
    """A JSON value from the bus, bounded: texts cleaned and cut, lists and objects cut to ``MAX_ITEMS``
    entries (a cut object says how many it left out under ``…``), nesting cut at ``depth``."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return clean(value)
    if depth <= 0:
        return "…"
    if isinstance(value, list | tuple):
        return [clip(item, depth - 1) for item in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        items = list(value.items())
        out = {clean(k): clip(v, depth - 1) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["…"] = f"{len(items) - MAX_ITEMS} more"
        return out
    return clean(value)
