"""The render log: one JSON line per finished render, read by the Spark stats job.

Fields: ``metatile`` (``z/mx/my``), ``zoom``, ``renderer`` (the thread's endpoint name), ``start`` (Unix
time, seconds), ``duration`` (seconds), ``status`` (``ok`` or ``error``), plus ``reason`` on errors.
Lines are appended with one ``write`` on an ``O_APPEND`` file so concurrent writers never interleave.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from pydantic import BaseModel


class RenderLogRecord(BaseModel):
    metatile: str
    zoom: int
    renderer: str
    start: float
    duration: float
    status: str
    reason: str | None = None


class RenderLog:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: RenderLogRecord) -> None:
        if self.path is None:
            return
        line = orjson.dumps(record.model_dump(exclude_none=True)) + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
