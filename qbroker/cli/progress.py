"""Showing the progress alerts of long requests: a rich progress bar on a terminal, plain lines otherwise.

A service that publishes progress does so as alerts named ``<service>.progress.<owner>.<job id>``
(``qbroker.progress``; the Spark bridge: ``spark.progress.<owner>.<job_id>`` with ``phase``, ``counters`` and
``spark`` stage/task totals). The CLI listens to ``<first word of the endpoint>.progress.<its account>.#``
while its call runs (the broker lets a client hear its own jobs only), and shows one line per job that
reports during the call. Everything goes to stderr: stdout keeps the reply for pipes.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from qbroker.cli.output import printable
from qbroker.progress import own_progress, progress_prefix

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from qbroker import Unit

MAX_JOBS_SHOWN = 20  # a flood of forged progress alerts must not flood the terminal


def progress_pattern(endpoint: str, account: str) -> str:
    """The progress of ``account``'s own jobs at the service ``endpoint`` belongs to."""
    return own_progress(progress_prefix(endpoint.split(".", 1)[0]), account)


def describe(snapshot: dict[str, Any]) -> tuple[str, int | None, int]:
    """(description, total tasks or None, tasks done) of one progress alert."""
    job_id = str(snapshot.get("job_id", "?"))
    spark = snapshot.get("spark") if isinstance(snapshot.get("spark"), dict) else {}
    assert isinstance(spark, dict)
    parts = [
        str(snapshot.get("kind") or "job"),
        job_id[:12],
        str(snapshot.get("state") or ""),
        str(snapshot.get("phase") or ""),
    ]
    if spark.get("stages"):
        parts.append(f"stages {spark.get('stages_active', 0)} active/{spark['stages']}")
    counters = snapshot.get("counters")
    if isinstance(counters, dict) and counters:
        parts.append(", ".join(f"{k} {v}" for k, v in list(counters.items())[:4]))
    total = spark.get("tasks")
    done = spark.get("tasks_completed", 0)
    text = printable(" ".join(p for p in parts if p))  # an alert: off the wire
    return (text, total if isinstance(total, int) and total > 0 else None, done if isinstance(done, int) else 0)


class ProgressView:
    def __init__(self, stream: TextIO | None = None, *, only_job: str | None = None) -> None:
        self.stream = stream or sys.stderr
        self.only_job = only_job
        self.rich = self.stream.isatty()
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._last: dict[str, str] = {}

    def attach(self, unit: Unit, endpoint: str) -> None:
        unit.on_alert(progress_pattern(endpoint, unit.bus.supervisor.user))(self.update)

    async def update(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("job_id"), str):
            return
        job_id = body["job_id"]
        if self.only_job is not None and job_id != self.only_job:
            return
        if job_id not in self._last and len(self._last) >= MAX_JOBS_SHOWN:
            return
        text, total, done = describe(body)
        if self.rich:
            self._show_bar(job_id, text, total, done)
        else:
            line = f"progress: {text}" + (f" tasks {done}/{total}" if total else "")
            if self._last.get(job_id) != line:
                self.stream.write(line + "\n")
                self.stream.flush()
        self._last[job_id] = text

    def _show_bar(self, job_id: str, text: str, total: int | None, done: int) -> None:
        from rich.markup import escape

        text = escape(text)  # the bar's text is rich markup: brackets from the wire are shown, not obeyed
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._progress.start()
        task = self._tasks.get(job_id)
        if task is None:
            self._tasks[job_id] = self._progress.add_task(text, total=total, completed=done)
        else:
            self._progress.update(task, description=text, total=total, completed=done)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
