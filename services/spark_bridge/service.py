"""The bus face of the bridge: ``spark.expire``, ``spark.stats`` and the ``spark.job`` command endpoint.

Submitting answers ``{"job_id", "kind", "state"}`` at once; with ``wait=true`` the handler detaches
(acks the request so a long job does not hold a prefetch slot) and answers the finished job record.
Progress goes out as ``spark.progress.<owner>.<job_id>`` alerts; expirations as text on ``expire_toposm``, once
on qbroker's ``alert`` exchange and once on TopOSM's ``osm`` (``services.toposm.expiry_wires``; docs/tiles.md). Every
invalid request is answered ``fail`` naming the problem.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from pyspark.sql import SparkSession

from qbroker import RequestContext, Unit
from qbroker.metrics_port import MetricsServer
from qbroker.progress import progress_key
from services.spark_bridge.confine import InputRefused, InputRoots, output_dir
from services.spark_bridge.expire_inputs import InputError, validate_inputs
from services.spark_bridge.expire_job import ExpireParams, run_expire
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.job_state import JobRecord, JobState
from services.spark_bridge.jobs import JobManager, JobsBusy, UnknownJob
from services.spark_bridge.limits import BridgeLimits
from services.spark_bridge.metrics import NAMESPACE, BridgeMetrics
from services.spark_bridge.models import ExpireRequest, StatsRequest
from services.spark_bridge.render_apply import end_workers
from services.spark_bridge.stats_job import StatsParams, run_stats
from services.spark_bridge.store_job import run_store_expire
from services.spark_bridge.store_lookup import DRIVER_LOOKUP_BYTES
from services.spark_bridge.stores import Stores, store_job_for
from services.toposm.contract import SPARK_EXPIRE, SPARK_JOB, SPARK_PROGRESS, SPARK_STATS, SparkJobCommand
from services.toposm.error_messages import errored, failed
from services.toposm.expiry_wires import OsmPublisher, publish_expiry
from services.toposm.metrics_port import service_metrics
from services.toposm.seed_wire import hear_all_programs

log = structlog.get_logger("spark_bridge")

PUBLISH_TIMEOUT = 60.0


def _finished_reply(record: JobRecord) -> dict[str, Any]:
    if record.state is JobState.FAILED:
        raise failed("job_failed", f"job {record.job_id}: {record.error}")
    if record.state is JobState.CANCELLED:
        raise failed("job_cancelled", f"job {record.job_id}")
    return record.model_dump(mode="json")


class SparkBridge:
    """The bridge's endpoints on ``unit``; a ``qbroker.runner.Service`` (start/stop).

    ``spark`` is a running session, or a function that builds one: then ``start()`` builds it in a
    worker thread (a JVM launch takes seconds and must not stall the event loop) and ``stop()`` stops
    it. Requests that arrive before the session is up are answered ``error`` (retryable).
    """

    def __init__(
        self,
        unit: Unit,
        spark: SparkSession | Callable[[], SparkSession],
        state_dir: Path,
        *,
        max_jobs: int = 2,
        progress_interval: float = 1.0,
        input_roots: Sequence[Path] | None = None,
        limits: BridgeLimits | None = None,
        stores: Sequence[Path] = (),
        driver_lookup_bytes: int = DRIVER_LOOKUP_BYTES,
        operator_users: frozenset[str] = frozenset(),
        metrics: MetricsServer | None = None,
    ) -> None:
        self.unit = unit
        # Accounts that see and cancel every job (TOPOSM_OPERATOR_USERS); everyone else only their own.
        self.operator_users = operator_users
        self.metrics_server = metrics or service_metrics(NAMESPACE, None)
        self.metrics = BridgeMetrics(self.metrics_server.registry, lambda: self._manager)
        self.metrics_server.refreshers.append(self.metrics.refresh)
        self.metrics_server.instrument(unit)
        self.stores = Stores.of(stores, driver_lookup_bytes)  # the only stores a request may name (--store)
        self.state_dir = state_dir
        self.limits = limits or BridgeLimits()
        # No roots given: a directory of the bridge's own, never "anywhere the bridge user can read".
        if not input_roots:
            default_root = state_dir / "inputs"
            default_root.mkdir(parents=True, exist_ok=True)
            input_roots = [default_root]
        self.input_roots = InputRoots.of(input_roots)
        self.outputs_root = state_dir / "outputs"
        self._build_session = None if isinstance(spark, SparkSession) else spark
        self._max_jobs = max_jobs
        self._progress_interval = progress_interval
        self._manager: JobManager | None = None
        self._session: SparkSession | None = None
        if isinstance(spark, SparkSession):
            self._manager = self._make_manager(spark)
        self._osm = OsmPublisher()
        unit.on_connected(self._osm.declare)
        hear_all_programs(unit, self._program_command)
        self._register()

    def _make_manager(self, spark: SparkSession) -> JobManager:
        return JobManager(
            spark,
            self.state_dir,
            max_jobs=self._max_jobs,
            progress_sink=self._publish_progress,
            progress_interval=self._progress_interval,
            max_pending=self.limits.max_pending_jobs,
            keep_jobs=self.limits.keep_jobs,
            keep_seconds=self.limits.keep_seconds,
        )

    @property
    def manager(self) -> JobManager:
        if self._manager is None:
            raise errored("spark_starting")
        return self._manager

    async def start(self) -> None:
        if self._manager is None and self._build_session is not None:
            self._session = await asyncio.to_thread(self._build_session)
            self._manager = self._make_manager(self._session)
        self.metrics_server.start()
        log.info("spark bridge online", max_jobs=self._max_jobs, state_dir=str(self.state_dir))

    async def stop(self) -> None:
        """Cancel running jobs, then stop the session if this bridge built it."""
        await self.metrics_server.stop()
        await self.close()
        if self._session is not None:
            await asyncio.to_thread(self._session.stop)
            self._session = None

    @staticmethod
    async def _program_command(body: dict[str, Any]) -> None:
        """Said to every program (``toposm``, both wires). The bridge has nothing to do on any of it: a
        queuemaster (back) online takes the expirations published meanwhile from its durable osm queue."""
        log.info("heard on toposm", command=str(body["command"])[:64])

    async def _publish_progress(self, snapshot: dict[str, Any]) -> None:
        # Named after the job's owner: the broker lets each account hear its own jobs only (qbroker.progress).
        owner = self.manager.get(snapshot["job_id"]).owner
        await self.unit.alert(progress_key(SPARK_PROGRESS, owner, snapshot["job_id"]), snapshot)

    def _expiration_sender(self) -> Any:
        loop = asyncio.get_running_loop()

        def publish(text: str) -> None:  # called from the job's worker thread
            async def send() -> None:
                await publish_expiry(self.unit, self._osm, text)  # on qbroker's alert and TopOSM's osm

            asyncio.run_coroutine_threadsafe(send(), loop).result(timeout=PUBLISH_TIMEOUT)

        return publish

    async def _submitted(
        self, record: JobRecord, wait: bool, wait_timeout: float | None, ctx: RequestContext
    ) -> dict[str, Any]:
        if not wait:
            return {"job_id": record.job_id, "kind": record.kind, "state": record.state.value}
        await ctx.detach()
        try:
            record = await self.manager.wait(record.job_id, wait_timeout)
        except TimeoutError:
            detail = f"job {record.job_id} still {record.state.value} after {wait_timeout} s"
            raise failed("wait_timeout", detail) from None
        return _finished_reply(record)

    def _visible_to(self, user: str | None) -> Callable[[JobRecord], bool]:
        """Who sees (and cancels) a job: its owner, and the operators. A job of someone else's reads as
        unknown, so that job ids of other accounts cannot be probed."""
        if user is not None and user in self.operator_users:
            return lambda record: True
        return lambda record: user is not None and record.owner == user

    def _job(self, job_id: str, ctx: RequestContext) -> JobRecord:
        try:
            record = self.manager.get(job_id)
        except UnknownJob:
            record = None
        if record is None or not self._visible_to(ctx.user_id)(record):
            raise failed("unknown_job", f"job {job_id!r}")
        return record

    @staticmethod
    def _owner(ctx: RequestContext) -> str:
        if ctx.user_id is None:
            # The owner is the account RabbitMQ validated; a request without one could own nothing.
            raise failed("no_user_id")
        return ctx.user_id

    def _register(self) -> None:
        unit = self.unit

        @unit.rpc(SPARK_EXPIRE, prefetch=16)
        async def expire(request: ExpireRequest, ctx: RequestContext) -> dict[str, Any]:
            max_tiles = self.limits.guard("max_tiles", request.max_tiles)
            per_geometry = self.limits.guard("max_tiles_per_geometry", request.max_tiles_per_geometry)
            try:
                inputs = await asyncio.to_thread(validate_inputs, request.paths, self.input_roots)
            except InputRefused as exc:
                raise failed(exc.id, exc.message) from None
            except InputError as exc:
                raise failed("bad_input", str(exc)) from None
            params = ExpireParams(
                min_zoom=request.min_zoom,
                max_zoom=request.max_zoom,
                max_tiles=max_tiles,
                max_tiles_per_geometry=per_geometry,
                publish=request.publish,
                batch_max_bytes=request.batch_max_bytes,
                batch_max_tiles=request.batch_max_tiles,
                input_limits=self.limits.input_limits,
            )

            owner = self._owner(ctx)
            store_job = store_job_for(self.stores, request, inputs)

            def body(job: JobContext) -> dict[str, Any]:
                if store_job is not None:
                    return run_store_expire(inputs[0].path, store_job, params, job, inputs[0].name)
                return run_expire(inputs, params, job)

            publish = self._expiration_sender() if request.publish else None
            record = self._submit("expire", request.model_dump(mode="json"), body, owner, publish=publish)
            ctx.log.info("expire job submitted", job_id=record.job_id, inputs=len(inputs))
            return await self._submitted(record, request.wait, request.wait_timeout, ctx)

        @unit.rpc(SPARK_STATS, prefetch=16)
        async def stats(request: StatsRequest, ctx: RequestContext) -> dict[str, Any]:
            owner = self._owner(ctx)
            try:
                paths, request_paths, out_base = await asyncio.to_thread(self._stats_paths, request)
            except InputRefused as exc:
                raise failed(exc.id, exc.message) from None
            params = StatsParams(
                window_seconds=request.window_seconds, since=request.since, until=request.until, chart=request.chart
            )

            def body(job: JobContext) -> dict[str, Any]:
                out_dir = out_base or self.manager.store.results_dir(job.job_id)
                return run_stats(paths, request_paths, params, out_dir, job)

            record = self._submit("stats", request.model_dump(mode="json"), body, owner)
            ctx.log.info("stats job submitted", job_id=record.job_id)
            return await self._submitted(record, request.wait, request.wait_timeout, ctx)

        jobs = unit.commands(SPARK_JOB, prefetch=32)

        @jobs.command(SparkJobCommand.STATUS)
        async def status(job_id: str, ctx: RequestContext) -> dict[str, Any]:
            return self._job(job_id, ctx).model_dump(mode="json", exclude={"result"})

        @jobs.command(SparkJobCommand.PROGRESS)
        async def progress(job_id: str, ctx: RequestContext) -> dict[str, Any]:
            self._job(job_id, ctx)
            return await asyncio.to_thread(self.manager.progress, job_id)

        @jobs.command(SparkJobCommand.RESULT)
        async def result(job_id: str, ctx: RequestContext) -> dict[str, Any]:
            record = self._job(job_id, ctx)
            if not record.state.finished:
                raise failed("job_not_finished", f"job {job_id} is {record.state.value}")
            _finished_reply(record)  # a failed/cancelled job has no result: answer fail with the reason
            return {"job_id": job_id, "kind": record.kind, "result": record.result}

        @jobs.command(SparkJobCommand.LOG)
        async def log_tail(job_id: str, ctx: RequestContext, lines: int = 50) -> dict[str, Any]:
            self._job(job_id, ctx)
            if not 0 <= lines <= 10_000:
                raise failed("bad_lines", f"lines={lines}")
            return {"job_id": job_id, "lines": await asyncio.to_thread(self.manager.log_tail, job_id, lines)}

        @jobs.command(SparkJobCommand.CANCEL)
        async def cancel(job_id: str, ctx: RequestContext) -> dict[str, Any]:
            self._job(job_id, ctx)
            await ctx.detach()  # stopping Spark tasks can take a moment
            record = await self.manager.cancel(job_id)
            return {"job_id": job_id, "state": record.state.value, "error": record.error}

        @jobs.command(SparkJobCommand.LIST)
        async def list_jobs(
            ctx: RequestContext, state: JobState | None = None, kind: str | None = None, limit: int = 50
        ) -> dict[str, Any]:
            if not 1 <= limit <= 1000:
                raise failed("bad_limit", f"limit={limit}")
            records = self.manager.list_jobs(state=state, kind=kind, limit=limit, visible=self._visible_to(ctx.user_id))
            return {"jobs": [r.summary() for r in records], "max_jobs": self.manager.max_jobs}

    def _stats_paths(self, request: StatsRequest) -> tuple[list[Path], list[Path], Path | None]:
        """Inputs (regular files under the roots) and the output dir (a name under the state dir)."""
        paths = [self.input_roots.regular_file(p) for p in request.paths]
        request_paths = [self.input_roots.regular_file(p) for p in request.request_paths]
        out = output_dir(self.outputs_root, request.output_dir) if request.output_dir is not None else None
        return paths, request_paths, out

    def _submit(self, kind: str, params: dict[str, Any], body: Any, owner: str, publish: Any = None) -> JobRecord:
        try:
            return self.manager.submit(kind, params, body, publish=publish, owner=owner)
        except JobsBusy as exc:
            # Status error, not fail: the same request succeeds once jobs finish.
            raise errored("busy", str(exc)) from None

    async def close(self) -> None:
        if self._manager is not None:
            await self._manager.close()
        self.stores.close()  # after the jobs: no diff is writing any more
        end_workers()
