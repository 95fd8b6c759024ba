"""Schedules (EventMQ SCHEDULE / UNSCHEDULE): send a request or alert every N seconds or on a cron line.

``nohaste`` (EventMQ's header): do not send at once when scheduled; first send when the interval has
elapsed. A schedule lives in the unit that made it and stops with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from structlog.typing import FilteringBoundLogger

Send = Callable[[], Awaitable[None]]


# croniter is the ``cron`` extra: a program that never schedules on a cron line does not install it.
CRON_EXTRA = "cron schedules need croniter: pip install 'qbroker-amqp[cron]'"


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ModuleNotFoundError:
        raise ModuleNotFoundError(CRON_EXTRA, name="croniter") from None
    return croniter


def valid_cron(cron: str) -> bool:
    """Whether ``cron`` is a cron line croniter reads (ModuleNotFoundError naming the extra without it)."""
    return bool(_croniter().is_valid(cron))


def next_cron(cron: str, after: float) -> float:
    """The first time strictly after ``after`` (epoch seconds) that the cron line names (UTC)."""
    nxt: datetime = _croniter()(cron, datetime.fromtimestamp(after, tz=UTC)).get_next(datetime)
    return nxt.timestamp()


@dataclass
class Schedule:
    id: str
    name: str
    kind: Literal["cast", "alert"]
    every: float | None
    cron: str | None
    nohaste: bool
    runs: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def next_delay(self, now: float, first: bool) -> float:
        if self.cron is not None:
            return max(0.0, next_cron(self.cron, now) - now)
        assert self.every is not None
        return 0.0 if first and not self.nohaste else self.every


class Scheduler:
    def __init__(self, log: FilteringBoundLogger) -> None:
        self._schedules: dict[str, Schedule] = {}
        self._log = log

    def add(
        self,
        name: str,
        kind: Literal["cast", "alert"],
        send: Send,
        *,
        every: float | None,
        cron: str | None,
        nohaste: bool,
    ) -> Schedule:
        if (every is None) == (cron is None):
            raise ValueError("give exactly one of every= or cron=")
        if every is not None and every <= 0:
            raise ValueError("every must be positive")
        if cron is not None and not valid_cron(cron):
            raise ValueError(f"invalid cron expression {cron!r}")
        schedule = Schedule(uuid.uuid4().hex, name, kind, every, cron, nohaste)
        schedule.task = asyncio.create_task(self._loop(schedule, send), name=f"qbroker-schedule-{name}")
        self._schedules[schedule.id] = schedule
        return schedule

    async def _loop(self, schedule: Schedule, send: Send) -> None:
        first = True
        while True:
            await asyncio.sleep(schedule.next_delay(time.time(), first))
            first = False
            try:
                await send()
                schedule.runs += 1
            except Exception as exc:  # a lost broker must not end the schedule
                self._log.warning("scheduled send failed", name=schedule.name, error=str(exc))

    def remove(self, schedule_id: str) -> bool:
        schedule = self._schedules.pop(schedule_id, None)
        if schedule is None or schedule.task is None:
            return False
        schedule.task.cancel()
        return True

    async def close(self) -> None:
        for schedule_id in list(self._schedules):
            self.remove(schedule_id)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)
