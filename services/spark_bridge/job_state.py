"""Job records and their persistence as one JSON file per job in the state dir."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

log = structlog.get_logger("spark_bridge.jobs")

RESTARTED_REASON = "bridge restarted"


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class JobRecord(BaseModel):
    """Everything known about a job; this is what ``spark.job status`` answers and what is persisted."""

    job_id: str
    kind: str
    # The broker account (AMQP user_id, validated by RabbitMQ) that submitted the job: only it and the
    # bridge's operators see and cancel the job. None: submitted in-process, or recorded before owners.
    owner: str | None = None
    state: JobState = JobState.QUEUED
    params: dict[str, Any]
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    phase: str = "queued"
    counters: dict[str, int | float] = {}

    def summary(self) -> dict[str, Any]:
        """The record without its (possibly large) result, for listings."""
        return self.model_dump(mode="json", exclude={"result", "params"})


class JobStore:
    """``<state_dir>/jobs/<job_id>.json`` (record) and ``<job_id>.log`` (log lines)."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "jobs"
        self.root.mkdir(parents=True, exist_ok=True)
        self.results_root = state_dir / "results"

    def log_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.log"

    def results_dir(self, job_id: str) -> Path:
        return self.results_root / job_id

    def save(self, record: JobRecord) -> None:
        # Write-then-rename so a crash mid-write never leaves a truncated record behind.
        target = self.root / f"{record.job_id}.json"
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(record.model_dump_json(), encoding="utf-8")
        os.replace(tmp, target)

    def load_all(self) -> list[JobRecord]:
        """Every persisted job; jobs caught queued/running by a crash become failed ("bridge restarted")."""
        records: list[JobRecord] = []
        for path in sorted(self.root.glob("*.json")):
            try:
                record = JobRecord.model_validate_json(path.read_text(encoding="utf-8"))
            except (OSError, ValidationError) as exc:
                log.warning("unreadable job record skipped", path=str(path), error=str(exc)[:200])
                continue
            if not record.state.finished:
                record.state = JobState.FAILED
                record.error = RESTARTED_REASON
                record.finished_at = time.time()
                with contextlib.suppress(OSError):
                    self.save(record)
            records.append(record)
        return records

    def delete(self, job_id: str) -> None:
        """Remove a job's record, log and default results dir (pruning)."""
        for path in (self.root / f"{job_id}.json", self.log_path(job_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        results = self.results_dir(job_id)
        # Only a real directory the bridge made: never follow a symlink out of the state dir.
        if results.is_dir() and not results.is_symlink():
            shutil.rmtree(results, ignore_errors=True)

    def read_log_tail(self, job_id: str, lines: int) -> list[str]:
        path = self.log_path(job_id)
        if lines <= 0 or not path.exists():
            return []
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
