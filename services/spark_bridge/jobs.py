"""The job manager: ids, states, bounded concurrency, Spark job tags, cancel, progress, persistence.

Job bodies are blocking PySpark code; each runs in a worker thread (``asyncio.to_thread``) so that the
event loop keeps answering requests. Concurrency is bounded by a semaphore: a job waits ``queued`` for
a slot, then runs. Every state change is persisted so finished jobs survive a bridge restart.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from pyspark.sql import SparkSession

from services.spark_bridge.job_context import JobCancelled, JobContext
from services.spark_bridge.job_state import JobRecord, JobState, JobStore
from services.spark_bridge.spark_session import cancel_job, enter_job, leave_job, spark_progress

log = structlog.get_logger("spark_bridge.jobs")

JobBody = Callable[[JobContext], dict[str, Any]]
ProgressSink = Callable[[dict[str, Any]], Awaitable[None]]
# Errors whose message is the whole story for the user (bad input, guard); others get their type name too.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (ValueError, RuntimeError)
CANCEL_RETRY_SECONDS = 1.0
MAX_ERROR_CHARS = 2000


class UnknownJob(KeyError):
    """No job with that id."""


class JobsBusy(RuntimeError):
    """As many jobs as allowed are queued or running already."""


@dataclass
class _LiveJob:
    record: JobRecord
    ctx: JobContext
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def _describe_error(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # Py4J/Spark errors carry a JVM stack trace: the first line says what went wrong.
    first = text.splitlines()[0] if "\n\tat " in text or "JVM stacktrace" in text else text
    if not isinstance(exc, EXPECTED_ERRORS):
        first = f"{type(exc).__name__}: {first}"
    return first[:MAX_ERROR_CHARS]


class JobManager:
    def __init__(
        self,
        spark: SparkSession,
        state_dir: Path,
        *,
        max_jobs: int = 2,
        progress_sink: ProgressSink | None = None,
        progress_interval: float = 1.0,
        max_pending: int | None = None,
        keep_jobs: int = 1000,
        keep_seconds: float = 7 * 86_400.0,
    ) -> None:
        if max_jobs < 1:
            raise ValueError("max_jobs must be at least 1")
        self.max_pending = max(max_pending or 8 * max_jobs, max_jobs)
        self.keep_jobs = keep_jobs
        self.keep_seconds = keep_seconds
        self.spark = spark
        self.store = JobStore(state_dir)
        self.max_jobs = max_jobs
        self._slots = asyncio.Semaphore(max_jobs)
        self._records: dict[str, JobRecord] = {r.job_id: r for r in self.store.load_all()}
        self._live: dict[str, _LiveJob] = {}
        self._progress_sink = progress_sink
        self._progress_interval = progress_interval
        self.prune()

    # -- submitting and running ------------------------------------------------------------------

    def submit(
        self,
        kind: str,
        params: dict[str, Any],
        body: JobBody,
        publish: Callable[[str], None] | None = None,
        owner: str | None = None,
    ) -> JobRecord:
        if len(self._live) >= self.max_pending:
            raise JobsBusy(f"{len(self._live)} jobs are queued or running (the limit is {self.max_pending})")
        self.prune()
        job_id = uuid.uuid4().hex[:16]
        record = JobRecord(job_id=job_id, kind=kind, owner=owner, params=params, submitted_at=time.time())
        ctx = JobContext(job_id, self.spark, self.store.log_path(job_id), publish=publish)
        ctx.log(f"submitted {kind} job")
        live = _LiveJob(record=record, ctx=ctx)
        self._records[job_id] = record
        self._live[job_id] = live
        self.store.save(record)
        live.task = asyncio.create_task(self._run(live, body), name=f"spark-job-{job_id}")
        return record

    async def _run(self, live: _LiveJob, body: JobBody) -> None:
        record, ctx = live.record, live.ctx
        ticker: asyncio.Task[None] | None = None
        try:
            async with self._slots:
                record.state, record.started_at, record.phase = JobState.RUNNING, time.time(), "starting"
                self.store.save(record)
                ticker = asyncio.create_task(self._tick_progress(live))
                try:
                    result = await asyncio.to_thread(self._run_in_thread, record, ctx, body)
                except BaseException as exc:  # noqa: BLE001 - every outcome is recorded, nothing escapes
                    self._finish_failed(record, ctx, exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                else:
                    if ctx.cancel_requested.is_set():
                        self._finish(record, ctx, JobState.CANCELLED, error="cancelled while finishing")
                    else:
                        record.result = result
                        self._finish(record, ctx, JobState.SUCCEEDED)
        finally:
            if ticker is not None:
                ticker.cancel()
            live.done.set()
            self._live.pop(record.job_id, None)
            await self._emit_progress(live)

    def _run_in_thread(self, record: JobRecord, ctx: JobContext, body: JobBody) -> dict[str, Any]:
        enter_job(self.spark, record.job_id, f"{record.kind} {record.job_id}")
        try:
            ctx.check_cancelled()
            return body(ctx)
        finally:
            leave_job(self.spark, record.job_id)

    def _finish_failed(self, record: JobRecord, ctx: JobContext, exc: BaseException) -> None:
        if ctx.cancel_requested.is_set() or isinstance(exc, JobCancelled | asyncio.CancelledError):
            self._finish(record, ctx, JobState.CANCELLED, error="cancelled")
            return
        log.warning("job failed", job_id=record.job_id, kind=record.kind, error=str(exc)[:300])
        self._finish(record, ctx, JobState.FAILED, error=_describe_error(exc))

    def _finish(self, record: JobRecord, ctx: JobContext, state: JobState, error: str | None = None) -> None:
        record.state, record.error, record.finished_at = state, error, time.time()
        # A job that succeeded is done, whatever its last step was called; one that failed or was cancelled
        # keeps the phase it stopped in (where to look).
        record.phase = "done" if state is JobState.SUCCEEDED else ctx.phase
        record.counters = dict(ctx.counters)
        ctx.log(f"{state.value}" + (f": {error}" if error else ""))
        self.store.save(record)

    # -- progress --------------------------------------------------------------------------------

    def progress(self, job_id: str) -> dict[str, Any]:
        record = self.get(job_id)
        live = self._live.get(job_id)
        out: dict[str, Any] = {"job_id": job_id, "kind": record.kind, "state": record.state.value}
        if live is not None:
            out.update(live.ctx.snapshot())
            out["spark"] = spark_progress(self.spark, job_id) if record.state is JobState.RUNNING else None
        else:
            out.update({"phase": record.phase, "counters": record.counters, "spark": None})
        out["elapsed"] = round((record.finished_at or time.time()) - (record.started_at or time.time()), 3)
        return out

    async def _tick_progress(self, live: _LiveJob) -> None:
        while True:
            await asyncio.sleep(self._progress_interval)
            await self._emit_progress(live)

    async def _emit_progress(self, live: _LiveJob) -> None:
        if self._progress_sink is None:
            return
        try:
            snapshot = await asyncio.to_thread(self.progress, live.record.job_id)
            await self._progress_sink(snapshot)
        except Exception as exc:  # noqa: BLE001 - progress is best effort, never kills a job
            log.warning("progress alert failed", job_id=live.record.job_id, error=str(exc)[:200])

    # -- retention ---------------------------------------------------------------------------------

    def prune(self, now: float | None = None) -> list[str]:
        """Forget finished jobs older than ``keep_seconds`` and all but the newest ``keep_jobs`` finished
        ones (record, log and default results dir); returns the job ids dropped."""
        now = time.time() if now is None else now
        finished = sorted(
            (r for r in self._records.values() if r.state.finished and r.job_id not in self._live),
            key=lambda r: r.finished_at or r.submitted_at,
            reverse=True,
        )
        dropped = [
            r.job_id
            for i, r in enumerate(finished)
            if i >= self.keep_jobs or now - (r.finished_at or r.submitted_at) > self.keep_seconds
        ]
        for job_id in dropped:
            del self._records[job_id]
            self.store.delete(job_id)
        if dropped:
            log.info("finished jobs pruned", count=len(dropped))
        return dropped

    # -- queries and control ---------------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord:
        try:
            record = self._records[job_id]
        except KeyError:
            raise UnknownJob(job_id) from None
        live = self._live.get(job_id)
        if live is not None and not record.state.finished:
            record.phase, record.counters = live.ctx.phase, dict(live.ctx.counters)
        return record

    def list_jobs(
        self,
        state: JobState | None = None,
        kind: str | None = None,
        limit: int = 50,
        visible: Callable[[JobRecord], bool] | None = None,
    ) -> list[JobRecord]:
        records = [
            r
            for r in self._records.values()
            if (state is None or r.state is state)
            and (kind is None or r.kind == kind)
            and (visible is None or visible(r))
        ]
        records.sort(key=lambda r: r.submitted_at, reverse=True)
        return records[:limit]

    def log_tail(self, job_id: str, lines: int = 50) -> list[str]:
        self.get(job_id)
        live = self._live.get(job_id)
        return live.ctx.log_tail(lines) if live is not None else self.store.read_log_tail(job_id, lines)

    async def wait(self, job_id: str, timeout: float | None = None) -> JobRecord:
        record = self.get(job_id)
        live = self._live.get(job_id)
        if live is not None:
            await asyncio.wait_for(live.done.wait(), timeout)
        return record

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel a queued or running job; finished jobs are returned unchanged."""
        record = self.get(job_id)
        live = self._live.get(job_id)
        if live is None or record.state.finished:
            return record
        live.ctx.cancel_requested.set()
        live.ctx.log("cancel requested")
        if record.state is JobState.QUEUED:
            self._finish(record, live.ctx, JobState.CANCELLED, error="cancelled before it started")
            if live.task is not None:
                live.task.cancel()  # it is only waiting for a slot
            await live.done.wait()
            return record
        # Re-issue the Spark cancel until the body notices: a job started between two checks is caught too.
        while not live.done.is_set():
            await asyncio.to_thread(cancel_job, self.spark, job_id)
            try:
                await asyncio.wait_for(asyncio.shield(live.done.wait()), CANCEL_RETRY_SECONDS)
            except TimeoutError:
                continue
        return record

    async def close(self) -> None:
        """Cancel whatever still runs (used at shutdown)."""
        for job_id in list(self._live):
            await self.cancel(job_id)
