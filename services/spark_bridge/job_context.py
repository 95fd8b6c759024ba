"""What a running job's body (executing in a worker thread) sees of its job: progress, log, cancel."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from services.osmstore.osc_input import InputBudget

LOG_TAIL_LINES = 200


class JobCancelled(Exception):
    """Raised inside a job body when its cancellation was requested."""


class JobContext:
    """Thread-safe progress/log sink shared by the job body (worker thread) and the event loop."""

    def __init__(
        self, job_id: str, spark: SparkSession, log_path: Path | None, publish: Callable[[str], None] | None = None
    ) -> None:
        self.job_id = job_id
        self.spark = spark
        self.phase = "queued"
        self.counters: dict[str, int | float] = {}
        self.publish = publish
        self._log_tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._log_path = log_path
        self._lock = threading.Lock()
        self.cancel_requested = threading.Event()
        # Seconds spent in each phase so far (a phase entered twice adds up): where a job's time goes, in
        # its result (store jobs) and for benchmarks.
        self.phase_seconds: dict[str, float] = {}
        self._phase_started = time.perf_counter()

    def set_phase(self, phase: str) -> None:
        self.check_cancelled()
        self._close_phase()
        self.phase = phase
        self.log(f"phase {phase}")

    def _close_phase(self) -> None:
        now = time.perf_counter()
        self.phase_seconds[self.phase] = round(self.phase_seconds.get(self.phase, 0.0) + now - self._phase_started, 4)
        self._phase_started = now

    def timings(self) -> dict[str, float]:
        """Seconds per phase up to now, the current one included."""
        self._close_phase()
        return dict(self.phase_seconds)

    def count(self, name: str, value: int | float) -> None:
        self.counters[name] = value

    def log(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {message}"
        with self._lock:
            self._log_tail.append(line)
            if self._log_path is not None:
                with self._log_path.open("a", encoding="utf-8") as handle:
                    handle.write(line + "\n")

    def log_tail(self, lines: int) -> list[str]:
        with self._lock:
            return list(self._log_tail)[-lines:] if lines > 0 else []

    def check_cancelled(self) -> None:
        if self.cancel_requested.is_set():
            raise JobCancelled(self.job_id)

    def reading(self, budget: InputBudget) -> None:
        """Called as input is read (osc_input): progress counters, and the job's cancel taking effect."""
        self.count("input_bytes", budget.bytes)
        self.count("input_objects", budget.objects)
        self.check_cancelled()

    def snapshot(self) -> dict[str, Any]:
        return {"phase": self.phase, "counters": dict(self.counters)}
