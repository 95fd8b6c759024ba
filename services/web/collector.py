"""Feeding the status model from the bus: polls (queuemaster stats, Spark job list, unit pings for dead
letters), alerts (Spark progress, expirations) and the queuemaster's render log when it is readable.

Every call goes through ``call`` so that /metrics counts it by endpoint and status. A poll that fails
marks its part of the page offline; it never stops the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from aio_pika.abc import AbstractIncomingMessage

from qbroker import QBrokerError, RequestContext, RequestError, RequestFailed, Unit
from services.toposm import render_log
from services.toposm.contract import EXPIRE_TOPIC, QUEUEMASTER, SPARK_JOB, SPARK_PROGRESS, Command, SparkJobCommand
from services.toposm.expiry_wires import TwinFilter, Wire, expiry_key, expiry_text
from services.toposm.messages import StatsRequest
from services.toposm.seed_wire import OsmListener, hear_all_programs
from services.toposm.tilemath import Tile, ZoomRange, parse_tile_list

from .plain_words import why_no_answer
from .status import StatusModel
from .web_metrics import WebMetrics

log = structlog.get_logger("toposm.web")
PROGRESS_PATTERN = SPARK_PROGRESS + "#"
MAX_LOG_READ = 1 << 20  # bytes of render log read per poll: a huge backlog is caught up over several polls


class Collector:
    def __init__(
        self,
        unit: Unit,
        status: StatusModel,
        metrics: WebMetrics,
        *,
        zooms: ZoomRange,
        poll_interval: float = 1.0,
        render_log: Path | None = None,
    ) -> None:
        self.unit = unit
        self.status = status
        self.metrics = metrics
        self.zooms = zooms
        self.poll_interval = poll_interval
        self.render_log = render_log
        self._log_offset = 0
        self._log_inode: int | None = None
        self._in_long_line = False  # reading past a line longer than MAX_LOG_READ (no record: skipped)
        self._tasks: list[asyncio.Task[None]] = []
        self.wake = asyncio.Event()  # set to poll at once (after a render request)
        self.stats_timeout = max(2.0, poll_interval * 3)
        # Stats polls started and ended, for a fresh word on a queuemaster that did not answer last time.
        self._qm_polls_started = 0
        self._qm_polls_ended = 0
        self._qm_polled = asyncio.Condition()
        # The fast loop touches the status at least this often (a poll that times out, then its interval):
        # a live page that hears nothing for twice that (and a margin) says so.
        status.updates_within = round(2 * (self.stats_timeout + poll_interval) + 5, 1)
        # told of every expiry list seen on the bus (the tile server keeps it on disk, see freshness.py)
        self.expired_listeners: list[Callable[[list[Tile]], Awaitable[None]]] = []
        self.stopping = False
        unit.on_alert(PROGRESS_PATTERN)(self._on_progress)
        unit.on_alert(EXPIRE_TOPIC)(self._on_expire)
        # Expirations come on both wires (a program on `osm` alone publishes there only): each list taken once.
        self.expiry_twins = TwinFilter()
        unit.on_connected(OsmListener([EXPIRE_TOPIC], self._on_osm_expire).declare)
        hear_all_programs(unit, self._program_command)

    async def call(self, endpoint: str, body: Any, timeout: float) -> Any:
        status = "ok"
        try:
            return await self.unit.call(endpoint, body, timeout=timeout)
        except RequestFailed as exc:
            status = "fail"
            raise exc
        except RequestError as exc:
            status = "error"
            raise exc
        except QBrokerError as exc:
            status = type(exc).__name__
            raise exc
        finally:
            self.metrics.rpc_calls.labels(endpoint, status).inc()

    # -- alerts --------------------------------------------------------------------------------------

    async def _on_progress(self, body: Any, ctx: RequestContext) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("job_id"), str):
            ctx.log.info("progress alert without a job_id ignored")
            return
        self.status.job_progress(body)
        await self.status.touch()

    async def _on_expire(self, body: Any, ctx: RequestContext) -> None:
        await self._expiry_heard(body, ctx.message_id, "alert")

    async def _on_osm_expire(self, message: AbstractIncomingMessage) -> None:
        await self._expiry_heard(message.body, message.message_id, "osm")

    async def _program_command(self, body: dict[str, Any]) -> None:
        """Said to every program (``toposm``): a queuemaster (back) online is polled at once rather than at
        the next poll, so the page shows it as soon as it is there. Nothing else there concerns toposm-web."""
        if body["command"] == Command.QUEUEMASTER_ONLINE:
            self.wake.set()

    async def _expiry_heard(self, body: Any, message_id: str | None, wire: Wire) -> None:
        text = expiry_text(body)
        if text is None or not self.expiry_twins.first(expiry_key(message_id, text), wire):
            return
        tiles, _ = parse_tile_list(text[:1_000_000], self.zooms)
        for listener in self.expired_listeners:
            await listener(tiles)
        self.status.mark_expired(tiles)
        await self.status.touch()

    # -- polls ---------------------------------------------------------------------------------------

    async def poll_queuemaster(self) -> None:
        self._qm_polls_started += 1
        try:
            await self._poll_queuemaster()
        finally:
            self._qm_polls_ended += 1
            async with self._qm_polled:
                self._qm_polled.notify_all()

    async def _poll_queuemaster(self) -> None:
        try:
            stats = await self.call(QUEUEMASTER, StatsRequest().body(), timeout=self.stats_timeout)
        except QBrokerError as exc:
            self.status.set_queuemaster(None, why_no_answer(exc, "the queuemaster", QUEUEMASTER), str(exc))
            return
        if isinstance(stats, dict):
            self.status.set_queuemaster(stats)
        else:
            self.status.set_queuemaster(
                None, "the queuemaster's stats answer is not an object", f"stats answered {type(stats).__name__}"
            )

    async def queuemaster_answers(self) -> bool:
        """Whether the queuemaster answers: at once when the last poll had its answer; after one without, the
        word of a poll started now (one for every request asking meanwhile), so a queuemaster that has just
        come back is not taken for gone. Bounded: no word within two polls' time counts as no answer."""
        if self.status.queuemaster_health.online:
            return True
        asked = self._qm_polls_started
        self.wake.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2 * self.stats_timeout + self.poll_interval + 1), self._qm_polled:
                await self._qm_polled.wait_for(lambda: self._qm_polls_ended > asked)
        return self.status.queuemaster_health.online

    async def poll_jobs(self) -> None:
        try:
            answer = await self.call(SPARK_JOB, {"command": SparkJobCommand.LIST, "limit": 50}, timeout=5)
        except QBrokerError as exc:
            self.status.set_jobs(None, why_no_answer(exc, "the Spark bridge", SPARK_JOB), str(exc))
            return
        jobs = answer.get("jobs") if isinstance(answer, dict) else None
        self.status.set_jobs([j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else [])

    async def poll_units(self) -> None:
        units = []
        with contextlib.suppress(QBrokerError):
            async for reply in self.unit.gather("qbroker.ping", timeout=3, gap=0.5):
                if isinstance(reply.body, dict):
                    units.append(reply.body)
        self.status.set_units(units)

    def read_render_log(self) -> int:
        """New lines of the render log since the last read (start over when the file was replaced)."""
        if self.render_log is None:
            return 0
        try:
            info = os.stat(self.render_log)
        except OSError:
            return 0
        if info.st_ino != self._log_inode or info.st_size < self._log_offset:
            self._log_inode, self._log_offset, self._in_long_line = info.st_ino, 0, False
        if info.st_size == self._log_offset:
            return 0
        with open(self.render_log, "rb") as f:
            f.seek(self._log_offset)
            chunk = f.read(MAX_LOG_READ)
        cut = chunk.rfind(b"\n") + 1
        if cut == 0 and len(chunk) == MAX_LOG_READ:
            # A whole read without a line end: no render record is that long (the queuemaster writes none).
            # Skipped to its end, or the reader would stop here for good.
            self._log_offset += len(chunk)
            self._in_long_line = True
            return 0
        complete = chunk[:cut]
        self._log_offset += len(complete)
        if self._in_long_line and cut:  # the long line's last part
            complete = complete[complete.find(b"\n") + 1 :]
            self._in_long_line = False
        count = 0
        for line in complete.splitlines():
            record = render_log.parse_line(line)
            if record is not None:
                self.status.add_render(record)
                count += 1
        return count

    async def _loop(self, poll: Any, every: float, wake: asyncio.Event) -> None:
        # Checks ``stopping`` as well as being cancelled: Python 3.11's wait_for swallows a cancel that
        # lands as its inner wait completes (a render finishing at stop sets ``wake``), and the loop
        # went on polling for good. asyncio.timeout has no such window.
        while not self.stopping:
            try:
                await poll()
            except Exception:  # a bug in one poll must not blank the whole page
                log.exception("status poll failed", poll=poll.__name__)
            await self.status.touch()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await wake.wait()
            wake.clear()

    async def _fast(self) -> None:
        await self.poll_queuemaster()
        await asyncio.to_thread(self.read_render_log)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._loop(self._fast, self.poll_interval, self.wake)),
            asyncio.create_task(self._loop(self.poll_jobs, max(2.0, self.poll_interval * 2), asyncio.Event())),
            asyncio.create_task(self._loop(self.poll_units, max(5.0, self.poll_interval * 5), asyncio.Event())),
        ]

    async def stop(self, timeout: float = 1.0) -> None:
        """Cancel the polls; one that does not end within ``timeout`` is left to the event loop's close."""
        self.stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
