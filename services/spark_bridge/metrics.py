"""The Spark bridge's Prometheus metrics (``qbroker-spark-bridge --metrics-port``): jobs by state, job
seconds, tiles expired. Copied from the job manager's records on the event loop once a second; a job
counts in the histogram and in the expired tiles once, when it is first seen finished (jobs that finished
before this process started are not counted again). Labels are bounded: states are the JobState words,
kinds the bridge's own job kinds (expire, stats)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .job_state import JobState
from .jobs import JobManager

NAMESPACE = "spark_bridge"  # its metrics' prefix (spark_bridge_build_info)
JOB_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
JOB_KINDS = ("expire", "stats")
MAX_RECORDS = 100_000  # more than keep_jobs ever holds


def kind_label(kind: str) -> str:
    return kind if kind in JOB_KINDS else "other"


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry, manager: Callable[[], JobManager | None]) -> None:
        self.manager = manager
        self.jobs = Gauge(
            "spark_bridge_jobs", "Jobs known to the bridge, by state and kind", ["state", "kind"], registry=registry
        )
        self.seconds = Histogram(
            "spark_bridge_job_seconds",
            "Seconds from start to end of finished jobs",
            ["kind", "state"],
            buckets=JOB_BUCKETS,
            registry=registry,
        )
        self.tiles_expired = Counter(
            "spark_bridge_tiles_expired", "Tiles expired by succeeded expire jobs", registry=registry
        )
        self._finished: set[str] | None = None  # None until the first look: what was finished before us

    def refresh(self) -> None:
        manager = self.manager()
        if manager is None:  # the Spark session is still starting
            return
        counts = {(state.value, kind): 0 for state in JobState for kind in JOB_KINDS}
        first = self._finished is None
        finished = self._finished if self._finished is not None else set()
        for record in manager.list_jobs(limit=MAX_RECORDS):
            kind = kind_label(record.kind)
            counts[(record.state.value, kind)] = counts.get((record.state.value, kind), 0) + 1
            if not record.state.finished or record.job_id in finished:
                continue
            finished.add(record.job_id)
            if first:
                continue
            if record.started_at is not None and record.finished_at is not None:
                self.seconds.labels(kind, record.state.value).observe(record.finished_at - record.started_at)
            total = (record.result or {}).get("total_tiles")
            if record.state is JobState.SUCCEEDED and isinstance(total, int) and total > 0:
                self.tiles_expired.inc(total)
        self._finished = finished
        for (state, kind), n in counts.items():
            self.jobs.labels(state, kind).set(n)
