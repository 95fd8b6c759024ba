"""The queuemaster's state machine, independent of the bus.

It owns the render queue, the registered render threads, the waiters of ``render`` requests, the render
log and the counters. The bus adapter (``service``) feeds it validated messages, sends the
``render`` commands it decides on (``next_assignments``) and reports dead renderers. Everything here runs
on the event loop thread. Queue mutations are committed to SQLite before the method returns, until the
bus adapter starts ``commits`` (a ``GroupCommit``): then mutations join one transaction, and whoever
answers a message first awaits ``commits.durable()``, which commits it, so nothing is acknowledged before
it is on disk. Expiry lists come in through ``ExpiryIntake`` (``expiry_intake``), which it inherits.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from qbroker import RequestError
from services.toposm.contract import RENDER_ROOT, Command
from services.toposm.error_messages import errored, failed
from services.toposm.messages import RegisterRequest, RenderedRequest, UnregisterRequest
from services.toposm.render_log import RenderLogRecord
from services.toposm.strategy import choose_for_mix, parse_strategy
from services.toposm.tile_store import open_tile_store
from services.toposm.tilemath import Metatile, Tile, TileError, parse_metatile, parse_tile

from .access import Forbidden, describe_account
from .expiry_intake import ExpiryIntake
from .group_commit import GroupCommit
from .queue_store import QueueStore
from .render_log import RenderLog
from .render_queue import RenderQueue
from .render_threads import RenderThread, RenderThreadRegistry
from .render_waiters import RenderWaiters
from .settings import QueuemasterSettings
from .stats import QueuemasterStats

log = structlog.get_logger("toposm.queuemaster")
# The deadline of the qbroker request being handled (epoch seconds), set by the bus adapter: the command
# table's signature stays the same for both wires, and the osm wire carries no deadline.
request_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("request_deadline", default=None)


class Queuemaster(ExpiryIntake):
    def __init__(self, settings: QueuemasterSettings) -> None:
        self.settings = settings
        self.zooms = settings.zooms
        self.store = QueueStore(settings.state_file)
        self.queue = RenderQueue(self.store)
        self.tiles = open_tile_store(settings.tile_root, settings.tile_store)
        self.render_log = RenderLog(settings.render_log)
        self.threads = RenderThreadRegistry()
        self.stats = QueuemasterStats()
        self.rng = random.Random(settings.seed)
        self.render_waiters = RenderWaiters()
        self.requesting: Counter[Metatile] = Counter()  # `render` requests waiting, by metatile
        self.bulk_waiting: dict[Metatile, Counter[str | None]] = {}  # accounts' bulk requests waiting (bulk.py)
        self.work_available = asyncio.Event()  # set whenever a dispatch might now succeed
        self.work_available.set()
        # The bus adapter starts grouping (``commits.start()``) and awaits ``commits.durable()`` before it
        # answers anything that depends on a mutation: see ``group_commit``.
        self.commits = GroupCommit(self.store, self.render_log)
        # Set by the bus adapter: tells every expiry listener, on both wires, of a list taken by the
        # `expire` command (the protocol's way to expire is `expire_toposm`, which every program hears).
        self.announce_expiry: Callable[[str], Awaitable[None]] | None = None

    @property
    def waiters(self) -> dict[Metatile, dict[asyncio.Future[dict[str, Any]], str | None]]:
        return self.render_waiters.by_metatile

    @property
    def waiting(self) -> int:
        return self.render_waiters.waiting

    def fail_waiters(self) -> None:
        self.render_waiters.fail_all()

    def close(self) -> None:
        self.fail_waiters()
        self.commits.flush()
        self.store.close()

    # -- parsing with the configured zoom range --------------------------------------------------------

    def tile(self, text: str) -> Tile:
        try:
            return parse_tile(text, self.zooms)
        except TileError as exc:
            raise failed("invalid_tile", str(exc)) from None

    def metatile(self, text: str) -> Metatile:
        try:
            return parse_metatile(text, self.zooms)
        except TileError as exc:
            raise failed("invalid_metatile", str(exc)) from None

    # -- render requests --------------------------------------------------------------------------------

    async def request(
        self, tile_text: str, *, deadline: float | None = None, user: str | None = None
    ) -> dict[str, Any]:
        """Answer when the metatile holding the tile is rendered (at once if it is fresh).

        ``deadline`` (epoch seconds; default: the qbroker request's own, see ``request_deadline``, or
        ``default_deadline`` from now) ends the wait: a waiter whose caller gave up must not stay behind, nor
        keep the metatile's place (``RenderQueue.abandon``). ``user`` is the account the wait counts against."""
        deadline = request_deadline.get() if deadline is None else deadline
        tile = self.tile(tile_text)
        m = tile.metatile
        self.stats.count("requested")
        state = self.queue.state_of(m)
        answer = {"command": Command.RENDERED, "tile": str(tile), "metatile": str(m)}
        if state is None and self.tiles.metatile_exists(m):
            self.stats.count("requested_fresh")
            return answer
        self.check_room(user)  # before queueing: a refused request leaves no trace in the queue
        if state is None:
            self.queue.request(m, "missing")
        elif state in ("background", "bulk"):
            self.queue.request(m, "missing" if not self.tiles.metatile_exists(m) else "important")
        self.requesting[m] += 1
        gave_up = False
        try:
            return {**answer, **await self.wait_for(m, deadline, user)}
        except RequestError as exc:
            gave_up = exc.id == "render_timeout"
            raise
        finally:
            self.requesting[m] -= 1
            if self.requesting[m] <= 0:
                del self.requesting[m]
                # All who asked gave up: the place they gave it goes (a bulk request still waiting keeps bulk)
                outcome = self.queue.abandon(m) if gave_up else None
                if outcome is not None:
                    self.stats.count(f"abandoned_{outcome}")

    def check_room(self, user: str | None) -> None:
        """``busy`` when the account holds its share of waits already, or the queuemaster all it keeps."""
        held = self.render_waiters.held_by(user)
        if held >= self.settings.max_waits_per_account:
            self.stats.count("requests_refused_account")
            raise errored(
                "busy",
                f"{describe_account(user)} has {held} requests waiting already "
                f"(at most {self.settings.max_waits_per_account} per account)",
            )
        if self.waiting >= self.settings.max_waits:
            self.stats.count("requests_refused_busy")
            raise errored("busy", f"{self.waiting} render requests are waiting already")

    async def wait_for(self, m: Metatile, deadline: float | None, user: str | None = None) -> dict[str, Any]:
        """Wait until the metatile's next render is reported (``render_failed``; ``render_timeout`` at the
        deadline, or ``default_deadline`` from now without one; ``busy`` past the caps, ``check_room``)."""
        self.check_room(user)
        if deadline is None:
            deadline = time.time() + self.settings.default_deadline
        future = self.render_waiters.add(m, user)
        self.work_available.set()
        try:
            return await self.render_waiters.wait(m, future, deadline)
        except TimeoutError:
            self.stats.count("requests_past_deadline")
            raise errored("render_timeout", f"metatile {m}") from None

    # -- render threads ---------------------------------------------------------------------------------

    def _owned(self, thread: RenderThread, user: str | None) -> bool:
        return not self.settings.access.strict or thread.user == user

    def register(self, req: RegisterRequest, reply_to: str | None, *, user: str | None = None) -> dict[str, Any]:
        claimed = self.metatile(req.metatile) if req.metatile is not None else None
        existing = self.threads.get(req.endpoint)
        if existing is not None and not self._owned(existing, user):
            # Taking over another account's thread would hand its work (and its reports) to us.
            raise Forbidden(f"{req.endpoint} is registered by another account")
        thread = RenderThread(
            endpoint=req.endpoint,
            hostname=req.hostname,
            pid=req.pid,
            threadid=req.threadid,
            strategy=parse_strategy(req.strategy),
            reply_to=reply_to,
            user=user,
        )
        old = self.threads.add(thread)
        if old is not None and old.metatile is not None and old.metatile != claimed:
            self.queue.put_back(old.metatile)  # re-registered without the metatile it had: it lost it
        if claimed is not None:
            holder = self.threads.rendering(claimed)
            if holder is None or holder is thread:
                self.queue.claim(claimed)
                self.threads.assign(thread, claimed)
        self.stats.count("registrations")
        log.info(
            "render thread registered", renderer=thread.endpoint, strategy=str(thread.strategy), rendering=req.metatile
        )
        self.work_available.set()
        return {"command": Command.REGISTERED, "renderer": thread.endpoint, "strategy": str(thread.strategy)}

    def unregister(self, req: UnregisterRequest, reply_to: str | None, *, user: str | None = None) -> dict[str, Any]:
        threads = self.threads.matching(reply_to, req.hostname, req.pid, req.threadid)
        others = [t.endpoint for t in threads if not self._owned(t, user)]
        if others:
            # e.g. `unregister threadid: 0` naming every host's thread 0: refuse it whole, drop nothing.
            raise Forbidden(f"not this account's render threads: {', '.join(others[:5])}")
        for thread in threads:
            self._drop(thread, "unregistered")
        return {"command": Command.UNREGISTERED, "renderers": [t.endpoint for t in threads]}

    def thread_lost(self, thread: RenderThread, why: str) -> None:
        """The bus says this thread is gone (queue vanished or pings unanswered)."""
        if self.threads.get(thread.endpoint) is not thread:
            return
        self.stats.count("renderers_lost")
        log.warning(
            "render thread lost",
            renderer=thread.endpoint,
            why=why,
            metatile=str(thread.metatile) if thread.metatile else None,
        )
        self._drop(thread, why)

    def _drop(self, thread: RenderThread, why: str) -> None:
        m = thread.metatile
        self.threads.remove(thread)
        if m is not None:
            self.queue.put_back(m)  # to the front: it was next in line already; its waiters keep waiting
            self.stats.count("requeued")
            self.work_available.set()
        log.info("render thread removed", renderer=thread.endpoint, why=why)

    def rendered(self, req: RenderedRequest, *, user: str | None = None) -> dict[str, Any]:
        m = self.metatile(req.metatile)
        thread = self.threads.rendering(m)
        if thread is None and req.next:
            # Under access checks the reporter must name itself, as `_check_reporter` demands.
            repeated = self.threads.handed_again(
                m, (req.hostname, req.pid, req.threadid), lambda t: self._owned(t, user), self.settings.access.strict
            )
            if repeated is not None:
                return repeated
        if self.settings.access.strict:
            self._check_reporter(m, thread, req, user)
        reporter = (req.hostname, req.pid, req.threadid)
        if (
            thread is not None
            and req.hostname is not None
            and reporter != (thread.hostname, thread.pid, thread.threadid)
        ):
            # A thread we had given up on (missed pings) finished after all, while another thread renders
            # the metatile again: its tiles are good for the waiters; the other thread reports for itself.
            self.stats.count("rendered_by_replaced_thread")
            if req.status == "ok":
                self.render_waiters.answer(m, "ok", None)
            return {"command": Command.ACK, "metatile": str(m), "expected": False}
        if self.queue.state_of(m) != "rendering":
            # Not in flight (e.g. given up on as dead, then the renderer came back): nothing to settle
            # except waiters, which a successful render does satisfy.
            self.stats.count("rendered_unexpected")
            if req.status == "ok":
                self.render_waiters.answer(m, "ok", None)
            return {"command": Command.ACK, "metatile": str(m), "expected": False}
        again = self.queue.finish(m)
        renderer = (
            thread.endpoint
            if thread
            else (f"{RENDER_ROOT}.{req.hostname}.{req.pid}.{req.threadid}" if req.hostname else "unknown")
        )
        if thread is not None:
            self.threads.assign(thread, None)
            thread.pending = False
            thread.rendered += 1
        now = time.time()
        duration = (
            req.duration
            if req.duration is not None
            else (now - thread.busy_since if thread and thread.busy_since else 0.0)
        )
        self.stats.count("rendered" if req.status == "ok" else "failed")
        if req.status == "ok":
            self.stats.rendered(m.z, duration)
        if again:
            self.stats.count("rerender_after_expiry")
        self.render_log.append(
            RenderLogRecord(
                metatile=str(m),
                zoom=m.z,
                renderer=renderer,
                start=req.start or now - duration,
                duration=round(duration, 4),
                status=req.status,
                reason=req.reason,
            )
        )
        self.commits.pending()  # the line waits for the group commit (its finish opened one anyway)
        self.render_waiters.answer(m, req.status, req.reason)
        answer: dict[str, Any] = {"command": Command.ACK, "metatile": str(m), "expected": True, "queued_again": again}
        if req.next and thread is not None and thread.wire == "qbroker" and thread.idle:
            # The thread asked for its next metatile in this answer: no `render` round trip for it.
            nxt = self._assign_one(thread)
            if nxt is not None:
                answer["render"] = str(nxt)
                thread.handed = (m, answer)
        if "render" not in answer or again:  # an idle thread, or new work: a dispatch round may help
            self.work_available.set()
        return answer

    def _check_reporter(self, m: Metatile, thread: RenderThread | None, req: RenderedRequest, user: str | None) -> None:
        """Only the exact thread the metatile was dispatched to may report it (its account, its ids): a
        forged `rendered` would answer waiters though no tile was written."""
        if thread is None:
            raise Forbidden(f"metatile {m} is not being rendered by any thread")
        reporter = (req.hostname, req.pid, req.threadid)
        if thread.user != user or reporter != (thread.hostname, thread.pid, thread.threadid):
            raise Forbidden(f"metatile {m} was dispatched to another render thread")

    # -- dispatch ---------------------------------------------------------------------------------------

    def next_assignments(self) -> list[tuple[RenderThread, Metatile]]:
        """Pair idle threads with metatiles their strategies allow; each thread at most one."""
        assignments: list[tuple[RenderThread, Metatile]] = []
        idle = self.threads.idle_in_rotation()
        if idle:  # most rounds find none (threads take their next metatile with `rendered`): no statement
            with self.queue.batch():  # one transaction for the round, not one per pick
                self._assign(idle, assignments)
        return assignments

    def _assign(self, idle: list[RenderThread], assignments: list[tuple[RenderThread, Metatile]]) -> None:
        for thread in idle:
            m = self._assign_one(thread)
            if m is not None:
                thread.pending = True  # until the renderer accepts the `render`
                assignments.append((thread, m))

    def _assign_one(self, thread: RenderThread) -> Metatile | None:
        """Pick a metatile for an idle thread by its strategy and mark it in flight there."""
        by_zoom, bulk = self.settings.buckets.open_queues(self.queue)
        source = choose_for_mix(thread.strategy, self.queue.missing, self.queue.important, by_zoom, self.rng, bulk)
        if source is None:
            return None
        m = self.queue.pop(source)
        if m is not None:
            self.threads.assign(thread, m)
            thread.handed = None
        return m

    def dispatch_refused(self, thread: RenderThread, m: Metatile) -> None:
        """The renderer refused a render (e.g. busy): put the metatile back; the thread stays pending
        (not idle) until a ping shows what it is doing."""
        if thread.metatile == m:
            self.threads.assign(thread, None)
            self.queue.put_back(m)
            self.work_available.set()

    # -- stats ------------------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        by_zoom = self.queue.background_by_zoom()
        return {
            "command": Command.STATS,
            "queues": {
                "missing": self.queue.missing,
                "important": self.queue.important,
                "by_zoom": {str(z): n for z, n in sorted(by_zoom.items())},
                "bulk": self.queue.bulk,
                "total": self.queue.queued_count(),
                "rendering": len(self.queue.in_flight()),
                "rendering_by_class": dict(self.queue.in_flight_by_class()),
            },
            "thread_limits": self.settings.buckets.describe(),
            "renderers": [t.describe() for t in self.threads],
            "waiting_requests": self.render_waiters.count(),
            "zoom_range": [self.zooms.min_zoom, self.zooms.max_zoom],
            **self.stats.describe(group_commits=self.commits.commits),
        }
