"""Terminal progress for an import: objects loaded so far and the rate per kind since the start (rich)."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

_KINDS = ("nodes", "ways", "relations")


class ImportProgress:
    """Counts objects; when enabled, redraws a small live table a few times a second."""

    def __init__(self, *, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.counts = dict.fromkeys(_KINDS, 0)
        self._started = time.monotonic()
        self._last: dict[str, float] = {}
        self._console = console or Console(stderr=True)
        self._live: Live | None = None
        self._next_draw = 0.0

    def __enter__(self) -> ImportProgress:
        if self.enabled:
            self._live = Live(self._table(), console=self._console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def add(self, kind: str, count: int) -> None:
        """``count`` more objects of ``kind`` are in (the import reports a block at a time)."""
        self.counts[kind] += count
        if self._live is None:
            return
        now = time.monotonic()
        self._last[kind] = now
        if now >= self._next_draw:
            self._next_draw = now + 0.25
            self._live.update(self._table())

    def _table(self) -> Table:
        table = Table(title="toposm-import", show_edge=False)
        table.add_column("objects")
        table.add_column("read", justify="right")
        table.add_column("per second", justify="right")
        for kind in _KINDS:
            n = self.counts[kind]
            span = self._last.get(kind, self._started) - self._started
            rate = f"{n / span:,.0f}" if span > 0 else "-"
            table.add_row(kind, f"{n:,}", rate)
        return table
