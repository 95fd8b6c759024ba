"""What a render-list job shows while it runs: a rich progress bar on a terminal, a plain line every
``PLAIN_INTERVAL`` seconds otherwise (a log, a pipe), both on stderr (stdout keeps the ``--json`` report)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from qbroker.printable import printable

from .job import RenderListJob

PLAIN_INTERVAL = 10.0


class ProgressView:
    def __init__(self, job: RenderListJob, stream: TextIO | None = None) -> None:
        self.job = job
        self.stream = stream or sys.stderr
        self.rich = self.stream.isatty()
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._next_line = 0.0

    def start(self) -> None:
        p = self.job.progress
        if self.rich:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("metatiles", total=p.total, completed=p.settled, detail="")
        self.update()

    def update(self) -> None:
        p = self.job.progress
        counts = p.counts()
        detail = (
            f"rendered {counts['rendered']:,} skipped {counts['skipped']:,} failed {counts['failed']:,}"
            f"  {self.job.rate():.1f}/s"
        )
        if self.job.waiting:  # may quote the queuemaster's error message: escaped
            detail += f"  (asking again: {printable(self.job.waiting)})"
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=p.settled, detail=escape(detail))
            return
        now = time.monotonic()
        if now >= self._next_line or p.complete:
            self._next_line = now + PLAIN_INTERVAL
            self.stream.write(f"toposm-render-list: {p.settled:,}/{p.total:,} metatiles, {detail}\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self.update()
            self._bar.stop()
            self._bar = None
