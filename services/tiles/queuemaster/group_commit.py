"""Group commits: one SQLite commit (and one render-log write) per turn of the event loop.

A dispatched metatile used to cost the queuemaster two commits of its own: its pick and its finish. Under
load one turn of the loop handles several ``rendered`` reports and dispatch rounds; with group commits
they share one commit and one render-log write. Durability stays what it was where it matters: whoever
answers (or acks) a message first awaits ``durable()``, so nothing is acknowledged before it is on disk.
A renderer that got its ``ack`` knows the finish is committed; one that did not (the queuemaster was
SIGKILLed in between) retries its ``rendered``, as renderers do for two minutes. What a SIGKILL can lose
is only what nobody was told yet: a pick whose ``render`` went out (the renderer claims it back when it
registers again) or a finish not acked yet (retried; at worst the metatile renders once more).

The window is the rest of the current loop turn and the next (``call_soon``), not a timer: an idle queuemaster answers
as fast as before, a busy one groups whatever arrived together.
"""

from __future__ import annotations

import asyncio

import structlog

from qbroker import RequestError

from .queue_store import QueueStore
from .render_log import RenderLog

log = structlog.get_logger("toposm.queuemaster")


class GroupCommit:
    def __init__(self, store: QueueStore, render_log: RenderLog) -> None:
        self.store = store
        self.render_log = render_log
        self.active = False
        self._scheduled = False
        self._waiting: list[asyncio.Future[None]] = []  # answers held until the next commit

    def start(self) -> None:
        """Turn group commits on (on the event loop); until then every mutation commits at once."""
        self.store.defer_commits(self.pending)
        self.render_log.buffered = True
        self.active = True

    def pending(self) -> None:
        """Something was written: commit at the end of this loop turn."""
        if self.active and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._after_woken_tasks)

    def _after_woken_tasks(self) -> None:
        # One turn later: a `rendered` wakes the dispatch loop, whose picks then join this commit
        # instead of opening a second one right after it.
        asyncio.get_running_loop().call_soon(self.flush)

    @property
    def uncommitted(self) -> bool:
        return self.store.uncommitted or self.render_log.pending

    def flush(self) -> None:
        """Write the pending render-log lines, then commit the queue; release whoever awaits ``durable``."""
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        error: Exception | None = None
        try:
            self.render_log.flush()  # first: a committed finish always has its line
            self.store.commit()
        except Exception as exc:  # e.g. disk full: the answers waiting on it become errors, not acks
            log.exception("group commit failed")
            error = exc
        for future in waiting:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(RequestError("commit_failed", f"queue state not saved: {error}"))

    async def durable(self) -> None:
        """Return once every mutation made so far is committed (at once if nothing is pending)."""
        if not self.uncommitted:
            return
        if not self.active:
            self.flush()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self.pending()
        await future
