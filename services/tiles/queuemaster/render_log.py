"""The render log's writer: one JSON line per finished render (its schema: services/toposm/render_log.py).

Lines are appended with one ``write`` on an ``O_APPEND`` file so concurrent writers never interleave.

With ``buffered`` (the running queuemaster, group commits) lines wait in memory until ``flush()``, which
the queuemaster calls just before it commits the queue: one ``write`` per group instead of an open, a
write and a close per render, and a line is on disk before the commit that settles its render (a
SIGKILL in between leaves the line and renders the metatile once more: never a render without its line).
"""

from __future__ import annotations

import os
from pathlib import Path

from services.toposm.render_log import RenderLogRecord


class RenderLog:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.buffered = False
        self._pending: list[bytes] = []

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def append(self, record: RenderLogRecord) -> None:
        if self.path is None:
            return
        self._pending.append(record.line())
        if not self.buffered:
            self.flush()

    def flush(self) -> None:
        if not self._pending or self.path is None:
            return
        data = b"".join(self._pending)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            while written < len(data):  # a short write (signal, huge group): finish the rest
                written += os.write(fd, data[written:])
        finally:
            os.close(fd)
        self._pending.clear()
