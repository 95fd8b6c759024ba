"""A clock that moves only when the test says so, for schedules (cron lines) without waiting for the minute.

clock = ManualClock(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC).timestamp())
scheduler = BrokerScheduler(unit, clock=clock)
...
clock.set(datetime(2026, 1, 1, 12, 1, tzinfo=UTC).timestamp())   # the 12:01 run is sent now
"""

from __future__ import annotations

import asyncio


class ManualClock:
    """``now()`` is what the test set; ``sleep_until(t)`` returns once the test moved the clock to ``t``."""

    def __init__(self, start: float) -> None:
        self._now = start
        self._moved = asyncio.Condition()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, when: float) -> None:
        async with self._moved:
            await self._moved.wait_for(lambda: self._now >= when)

    def set(self, when: float) -> None:
        """Move to ``when`` (never backwards) and wake every sleeper that is due by then."""
        self._now = max(self._now, when)
        asyncio.get_running_loop().create_task(self._notify())

    def advance(self, seconds: float) -> None:
        self.set(self._now + seconds)

    async def _notify(self) -> None:
        async with self._moved:
            self._moved.notify_all()
