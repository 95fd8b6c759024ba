"""Group commits: the queue's writes are committed when an answer needs them, or soon after.

A dispatched metatile used to cost the queuemaster two commits of its own: its pick (the dispatch round)
and its finish (the ``rendered`` report), and a render-log open, write and close. Now writes join one
open transaction, and it is committed

* by ``durable()``, which whoever answers or acks a message calls first (``commands.Command.run``, the
  expiry broadcast), so nothing is acknowledged before it is on disk: a renderer that got its ``ack``
  knows the finish is committed, and one that did not (the queuemaster was SIGKILLed in between)
  retries its ``rendered``, as renderers do for two minutes;
* or within ``UNANSWERED_WITHIN`` seconds for writes nobody is told about (a dispatch round's picks, a
  lost thread's metatile put back): under load they ride along with the next ``rendered``'s commit. A
  restart puts every in-flight metatile back in its queue anyway, so these need no earlier commit.

``durable()`` commits at once rather than holding the answer for a later commit: an answer held back a
turn leaves in a broker-socket write of its own instead of sharing one with the ``render`` that the
same turn sends, and those writes cost more than the commits saved (docs/performance.md, "The
queuemaster"). What a SIGKILL can lose is only what nobody was told yet: a
pick whose ``render`` went out (the renderer claims it back when it registers again, or it renders from
the queue once more) or a finish whose ``ack`` was not sent (retried by its renderer).
"""

from __future__ import annotations

import asyncio

import structlog

from services.toposm.error_messages import errored

from .queue_store import QueueStore
from .render_log import RenderLog

log = structlog.get_logger("toposm.queuemaster")
# The longest an unanswered write waits for its commit (when no answer commits it sooner).
UNANSWERED_WITHIN = 0.05


class GroupCommit:
    def __init__(self, store: QueueStore, render_log: RenderLog) -> None:
        self.store = store
        self.render_log = render_log
        self.active = False
        self.commits = 0  # commits so far (stats: commits per dispatched metatile)
        self._scheduled = False
        self._turn_end: asyncio.Future[None] | None = None  # durable_soon() callers of this loop turn

    def start(self) -> None:
        """Turn group commits on (on the event loop); until then every mutation commits at once."""
        self.store.defer_commits(self.pending)
        self.render_log.buffered = True
        self.active = True

    def pending(self) -> None:
        """Something was written: commit within UNANSWERED_WITHIN, unless an answer does it first. One
        timer at a time, kept when an answer commits (a timer per transaction cost more than the commits)."""
        if self.active and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(UNANSWERED_WITHIN, self._flush_logged)

    @property
    def uncommitted(self) -> bool:
        return self.store.uncommitted or self.render_log.pending

    def flush(self) -> None:
        """Write the pending render-log lines, then commit the queue."""
        self.render_log.flush()  # first: a committed finish always has its line
        if self.store.uncommitted:
            self.store.commit()
            self.commits += 1

    def _flush_logged(self) -> None:
        self._scheduled = False
        if not self.uncommitted:
            return  # an answer committed meanwhile
        try:
            self.flush()
        except Exception:  # e.g. disk full; the next answer's durable() tries again and fails visibly
            log.exception("queue commit failed")

    async def durable_soon(self) -> None:
        """``durable()`` for the callers of one loop turn together: expiry broadcasts delivered in one
        read from the broker share a commit (consecutive messages often touch the same B-tree pages, so
        one commit writes each page once, not once per message)."""
        if not self.active:
            await self.durable()
            return
        if self._turn_end is None:
            self._turn_end = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._end_turn)
        await asyncio.shield(self._turn_end)

    def _end_turn(self) -> None:
        future, self._turn_end = self._turn_end, None
        if future is None:
            return
        try:
            if self.uncommitted:
                self.flush()
        except Exception as exc:
            log.exception("queue commit failed")
            future.set_exception(errored("commit_failed", str(exc)))
            return
        future.set_result(None)

    async def durable(self) -> None:
        """Commit everything written so far, now (a no-op if nothing is pending)."""
        if self.uncommitted:
            try:
                self.flush()
            except Exception as exc:  # the caller answers an error instead of acknowledging
                log.exception("queue commit failed")
                raise errored("commit_failed", str(exc)) from None
