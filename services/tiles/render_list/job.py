"""The job: every metatile of the plan sent as a ``bulk`` request, ``window`` of them in flight at once.

Like renderd's render_list, each request is answered when its metatile is rendered (or at once when
``missing_only`` finds it rendered before), so the window bounds what this job has queued at the
queuemaster, and its progress is its answers. What the queuemaster cannot do now (no queuemaster running,
busy, restarting, the request's deadline passed while others rendered first) is asked again after a pause
that grows to ``MAX_PAUSE``; a failed render is settled as failed and reported; a refusal (``fail``: an
account without the right, a queuemaster without ``bulk``) ends the job.

Stopping (``stop``) sends no new requests, withdraws what is still queued for this job (``cancel``), and
waits up to its timeout for the renders already running; whatever is not settled by then is asked again
by the next run with the same resume file. A queuemaster (back) online (``queuemaster_online``, heard on
``toposm``) ends every pause at once: what waited for it is asked again now, not after up to ``MAX_PAUSE``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from qbroker import NoServer, QBrokerError, RequestError, RequestFailed, Unit
from services.toposm.contract import QUEUEMASTER
from services.toposm.messages import MAX_CANCEL, BulkRenderRequest, CancelBulkRequest
from services.toposm.tilemath import Metatile

from .area import AreaPlan
from .resume import Progress

log = structlog.get_logger("toposm.render_list")
FIRST_PAUSE = 0.5
MAX_PAUSE = 30.0
# Request outcomes that are no answer about the metatile: ask again (after a pause).
ASK_AGAIN = frozenset({"render_timeout", "queuemaster_stopped", "busy", "commit_failed", "bulk_cancelled"})


@dataclass(frozen=True)
class JobSettings:
    missing_only: bool = False
    priority: str = "bulk"
    window: int = 32
    request_timeout: float = 600.0  # one request's deadline; a metatile still queued then is asked again
    drain_timeout: float = 10.0  # stopping: how long the renders already running are waited for


class RenderListJob:
    def __init__(
        self,
        unit: Unit,
        plan: AreaPlan,
        progress: Progress,
        settings: JobSettings,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.unit = unit
        self.plan = plan
        self.progress = progress
        self.settings = settings
        self.changed = changed
        self.in_flight: dict[int, Metatile] = {}
        self.fatal: str | None = None
        self.waiting: str | None = None  # why requests are being asked again, shown with the progress
        self.started = time.monotonic()
        self.settled_now = 0  # settled by this run (the rate)
        self._ahead = set(progress.settled_ahead)
        self._stop = asyncio.Event()
        self._online = asyncio.Event()  # replaced by a new one each time it is set: it wakes the pauses of then
        self._slots = asyncio.Semaphore(settings.window)
        self._tasks: set[asyncio.Task[None]] = set()
        self._drained = False

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        for position, metatile in self.plan.metatiles(self.progress.next):
            if position in self._ahead:
                continue
            await self._slots.acquire()
            if self.stopping:
                break
            self.in_flight[position] = metatile
            task = asyncio.create_task(self._one(position, metatile))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.fatal:
            await self.stop()
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def stop(self) -> None:
        """Within the drain timeout: no new requests, this job's queued metatiles withdrawn, running renders
        waited for; then whatever is left is abandoned (asked again by the next run)."""
        if self._drained:
            return
        self._drained = True
        self._stop.set()
        self._slots.release()  # wakes the feeder if it waits for a slot: it sees the stop and ends
        deadline = time.monotonic() + self.settings.drain_timeout
        pending = [str(m) for m in self.in_flight.values()]
        for start in range(0, len(pending), MAX_CANCEL):
            chunk = pending[start : start + MAX_CANCEL]
            try:
                answer = await self.unit.call(
                    QUEUEMASTER,
                    CancelBulkRequest(metatiles=chunk).body(),
                    timeout=max(0.1, min(5.0, deadline - time.monotonic())),
                )
                log.info("withdrawn from the queue", withdrawn=answer.get("withdrawn"), asked=len(chunk))
            except QBrokerError as exc:  # they render anyway; the next run asks for them again
                log.warning("queued metatiles not withdrawn", error=str(exc), count=len(chunk))
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=max(0.0, deadline - time.monotonic()))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def _abandon(self, position: int) -> None:
        self.in_flight.pop(position, None)
        self._slots.release()

    def _settle(self, position: int, metatile: Metatile, outcome: str, reason: str | None = None) -> None:
        self.in_flight.pop(position, None)
        self.progress.record(metatile.z, outcome, str(metatile), reason)
        self.settled_now += 1
        if position == self.progress.next:
            self.progress.next += 1
            while self.progress.next in self._ahead:
                self._ahead.discard(self.progress.next)
                self.progress.next += 1
        else:
            self._ahead.add(position)
        self.progress.settled_ahead = sorted(self._ahead)
        self.waiting = None
        self._slots.release()
        self.changed()

    async def _one(self, position: int, metatile: Metatile) -> None:
        body = BulkRenderRequest(
            metatile=str(metatile), priority=self.settings.priority, missing_only=self.settings.missing_only
        ).body()
        pause = FIRST_PAUSE
        try:
            while not self.stopping:
                try:
                    reply = await self.unit.call(QUEUEMASTER, body, timeout=self.settings.request_timeout)
                except NoServer:
                    self._note("no queuemaster is running")
                except RequestFailed as exc:  # refused: asking again changes nothing
                    self.fatal = self.fatal or f"the queuemaster refused {metatile}: {exc}"
                    self._stop.set()  # the feeder wakes when this request's slot is given back, below
                    break
                except RequestError as exc:
                    if self.stopping:  # withdrawn (bulk_cancelled) or cut short: the next run asks again
                        break
                    if exc.id == "render_failed":
                        self._settle(position, metatile, "failed", exc.detail or exc.message)
                        return
                    if exc.id not in ASK_AGAIN:
                        self._note(f"{exc.id}: {exc.message}")
                    elif exc.id != "render_timeout":
                        self._note(exc.id)
                    if exc.id == "render_timeout":
                        continue  # still queued behind other work: ask again at once, keeping its place
                except QBrokerError as exc:
                    self._note(f"{type(exc).__name__}: {exc}")
                else:
                    skipped = isinstance(reply, dict) and reply.get("skipped") is True
                    self._settle(position, metatile, "skipped" if skipped else "rendered")
                    return
                await self._pause(pause)
                pause = min(MAX_PAUSE, pause * 2)
        except asyncio.CancelledError:
            self._abandon(position)
            raise
        self._abandon(position)

    def queuemaster_online(self) -> None:
        """A queuemaster announced itself: every request pausing after a failure asks again now."""
        online, self._online = self._online, asyncio.Event()
        online.set()

    async def _pause(self, seconds: float) -> None:
        """``seconds``, or until the job stops or a queuemaster comes online."""
        waits = {asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._online.wait())}
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _note(self, why: str) -> None:
        if self.waiting != why:
            self.waiting = why
            log.warning("asking again", why=why)
            self.changed()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.settled_now / elapsed if elapsed > 0 else 0.0
