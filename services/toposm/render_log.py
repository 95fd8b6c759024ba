"""The render log's one schema: the queuemaster writes it, toposm-web and the Spark stats job read it.

One JSON object per line, one line per finished render: ``metatile`` (``z/mx/my``), ``zoom``, ``renderer``
(the render thread's endpoint name), ``start`` (Unix time, seconds), ``duration`` (seconds), ``status``
(``ok`` or ``error``), plus ``reason`` on errors. The writer (services/tiles/queuemaster/render_log.py)
builds ``RenderLogRecord``; the readers take ``FIELDS`` (the Spark schema is drawn from it) and
``parse_line``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

STATUS_OK: Final = "ok"
STATUS_ERROR: Final = "error"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: type  # str, int or float: what a reader may expect the JSON value to be
    optional: bool = False


FIELDS: Final = (
    Field("metatile", str),
    Field("zoom", int),
    Field("renderer", str),
    Field("start", float),
    Field("duration", float),
    Field("status", str),
    Field("reason", str, optional=True),
)
FIELD_NAMES: Final = tuple(f.name for f in FIELDS)


@dataclass(frozen=True, slots=True)
class RenderLogRecord:
    # A plain dataclass, not a validated model: built by the queuemaster itself for every render.
    metatile: str
    zoom: int
    renderer: str
    start: float
    duration: float
    status: str
    reason: str | None = None

    def line(self) -> bytes:
        fields: dict[str, Any] = {
            "metatile": self.metatile,
            "zoom": self.zoom,
            "renderer": self.renderer,
            "start": self.start,
            "duration": self.duration,
            "status": self.status,
        }
        if self.reason is not None:
            fields["reason"] = self.reason
        return orjson.dumps(fields) + b"\n"


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One line as a record, or None when it is not a JSON object (a torn or foreign line is skipped)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
