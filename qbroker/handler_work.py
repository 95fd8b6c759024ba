"""The handlers a unit is running: counted, so that a stop can drain them, and cancellable, so that a drain
that times out ends them at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from structlog.typing import FilteringBoundLogger


class HandlerWork:
    """What a unit's consumers are handling now (``track``), and the stop's side of it (``drain``)."""

    def __init__(self, log: FilteringBoundLogger) -> None:
        self.log = log
        self.inflight = 0
        self._tasks: set[asyncio.Task[Any]] = set()  # the tasks running tracked work, for drain()
        self._idle = asyncio.Event()
        self._idle.set()

    async def track(self, work: Awaitable[None]) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.inflight += 1
        self._idle.clear()
        try:
            await work  # what it raises, the bus's consumer guard answers and acks (Bus.settle_failed)
        finally:
            self.inflight -= 1
            if task is not None:
                self._tasks.discard(task)
                del task  # the frame, kept by a cancelled task's exception, must not keep the task: a cycle
            if self.inflight == 0:
                self._idle.set()

    async def drain(self, timeout: float) -> None:
        """Let running handlers finish, up to ``timeout``; then abandon what still runs."""
        try:
            async with asyncio.timeout(timeout):  # not wait_for: 3.11's can swallow a cancel
                await self._idle.wait()
        except TimeoutError:
            self.log.warning("drain timed out; abandoning the handlers still running", running=self.inflight)
            await self._abandon(timeout)

    async def _abandon(self, drain_timeout: float) -> None:
        """Cancel every handler still running, at once: left running, they would compete with the close for
        the loop (docs/performance.md, "Parked render requests"). A cancelled handler sends no reply (a
        request not acked is delivered again, as after ``kill()``); one ignoring the cancel is not waited for."""
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=min(1.0, max(0.05, drain_timeout)))
        self.log.info("handlers abandoned", count=len(tasks), still_running=self.inflight)
