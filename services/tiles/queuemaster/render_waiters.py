"""The ``render`` requests waiting for their metatile: one future each, kept by metatile.

Apart from the state machine because it is a concern of its own: how a waiter is counted, leaves at its
deadline without leaving the metatile's other waiters, and is answered when the render is reported.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from qbroker import RequestError
from services.toposm.error_messages import errored
from services.toposm.tilemath import Metatile

Waiter = asyncio.Future[dict[str, Any]]


class RenderWaiters:
    def __init__(self) -> None:
        self.by_metatile: dict[Metatile, list[Waiter]] = {}
        self.waiting = 0  # futures in ``by_metatile`` not done yet

    def add(self, m: Metatile) -> Waiter:
        future: Waiter = asyncio.get_running_loop().create_future()
        self.by_metatile.setdefault(m, []).append(future)
        self.waiting += 1
        future.add_done_callback(self._done)
        return future

    async def wait(self, m: Metatile, future: Waiter, deadline: float | None) -> dict[str, Any]:
        """The render's result; TimeoutError at ``deadline`` (epoch seconds), when only this waiter leaves:
        the metatile stays queued for the others."""
        if deadline is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(0.0, deadline - time.time()))
        except TimeoutError:
            self._drop(m, future)
            raise

    def answer(self, m: Metatile, status: str, reason: str | None) -> None:
        for future in self.by_metatile.pop(m, []):
            if future.done():
                continue
            if status == "ok":
                future.set_result({})
            else:
                future.set_exception(errored("render_failed", f"metatile {m}: {reason}"))

    def cancel(self, m: Metatile) -> None:
        """The metatile was withdrawn from the queue before it rendered (a stopped bulk pre-render)."""
        for future in self.by_metatile.pop(m, []):
            if not future.done():
                future.set_exception(errored("bulk_cancelled", f"metatile {m}"))

    def fail_all(self) -> None:
        for futures in self.by_metatile.values():
            for future in futures:
                if not future.done():
                    future.set_exception(RequestError("queuemaster_stopped", "the queuemaster is shutting down"))
        self.by_metatile.clear()

    def count(self) -> int:
        return sum(len(futures) for futures in self.by_metatile.values())

    def _done(self, _: Waiter) -> None:
        self.waiting -= 1

    def _drop(self, m: Metatile, future: Waiter) -> None:
        futures = self.by_metatile.get(m, [])
        if future in futures:
            futures.remove(future)
        if not futures:
            self.by_metatile.pop(m, None)
        if not future.done():
            future.remove_done_callback(self._done)  # counted off here, not a loop turn later
            self.waiting -= 1
            future.cancel()
