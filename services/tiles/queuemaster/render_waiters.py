"""The ``render`` requests waiting for their metatile: one future each, kept by metatile and counted by account.

Apart from the state machine because it is a concern of its own: how a waiter is counted (in all and per
account, for the caps in docs/tiles.md "Requests and waiters"), leaves at its deadline without leaving the
metatile's other waiters, and is answered when the render is reported.

Each waiter costs one future and one entry here: its deadline is a timer handle on the loop, not a task of
its own, and leaving is O(1) (an insertion-ordered dict per metatile), so 100,000 waiters for one metatile
leave at their deadlines in linear time. docs/performance.md has the memory per waiter.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from qbroker import RequestError
from services.toposm.error_messages import errored
from services.toposm.tilemath import Metatile

Waiter = asyncio.Future[dict[str, Any]]
Account = str | None  # the AMQP user-id the broker validated; None: a message without one (one account)


class RenderWaiters:
    def __init__(self) -> None:
        self.by_metatile: dict[Metatile, dict[Waiter, Account]] = {}
        self.by_account: Counter[Account] = Counter()
        self.waiting = 0  # waiters in ``by_metatile``

    def add(self, m: Metatile, account: Account = None) -> Waiter:
        future: Waiter = asyncio.get_running_loop().create_future()
        self.by_metatile.setdefault(m, {})[future] = account
        self.by_account[account] += 1
        self.waiting += 1
        return future

    def held_by(self, account: Account) -> int:
        return self.by_account.get(account, 0)

    async def wait(self, m: Metatile, future: Waiter, deadline: float | None) -> dict[str, Any]:
        """The render's result; TimeoutError at ``deadline`` (epoch seconds), when only this waiter leaves:
        the metatile stays queued for the others."""
        loop = asyncio.get_running_loop()
        timer = None
        if deadline is not None:
            timer = loop.call_at(loop.time() + max(0.0, deadline - time.time()), self._expire, m, future)
        try:
            return await future
        finally:
            if timer is not None:
                timer.cancel()
            self._leave(m, future)  # the awaiting task was cancelled (an abandoned handler at a stop)

    def answer(self, m: Metatile, status: str, reason: str | None) -> None:
        for future in self._take(m):
            if status == "ok":
                future.set_result({})
            else:
                future.set_exception(errored("render_failed", f"metatile {m}: {reason}"))

    def cancel(self, m: Metatile) -> None:
        """The metatile was withdrawn from the queue before it rendered (a stopped bulk pre-render)."""
        for future in self._take(m):
            future.set_exception(errored("bulk_cancelled", f"metatile {m}"))

    def fail_all(self) -> None:
        for m in list(self.by_metatile):
            for future in self._take(m):
                future.set_exception(RequestError("queuemaster_stopped", "the queuemaster is shutting down"))

    def forget_all(self) -> None:
        """Let go of every waiter without answering it (a stop answers their callers otherwise): nothing
        wakes their tasks, which stay parked until cancelled."""
        self.by_metatile.clear()
        self.by_account.clear()
        self.waiting = 0

    def count(self) -> int:
        return self.waiting

    def _take(self, m: Metatile) -> list[Waiter]:
        """Every waiter of ``m``, counted off."""
        waiters = self.by_metatile.pop(m, {})
        for account in waiters.values():
            self._uncount(account)
        return [future for future in waiters if not future.done()]

    def _expire(self, m: Metatile, future: Waiter) -> None:
        if self._leave(m, future):
            future.set_exception(TimeoutError())

    def _leave(self, m: Metatile, future: Waiter) -> bool:
        """Take one waiter off (False: it had left already)."""
        waiters = self.by_metatile.get(m)
        if waiters is None or future not in waiters:
            return False
        self._uncount(waiters.pop(future))
        if not waiters:
            del self.by_metatile[m]
        return not future.done()

    def _uncount(self, account: Account) -> None:
        self.waiting -= 1
        left = self.by_account[account] - 1
        if left > 0:
            self.by_account[account] = left
        else:
            del self.by_account[account]
