"""The queuemaster on the bus: endpoint ``toposm.queuemaster``, expirations, dispatch and liveness.

* ``toposm.queuemaster`` is a qbroker command endpoint (register, rendered, unregister, render, expire,
  stats) built from the command table in ``commands``, which the TopOSM ``osm`` exchange wire
  (``osm_wire``; docs/tiles.md, "The TopOSM wire") reads too.
* Expirations arrive as text ``z/x/y;...`` on ``expire_toposm``, on both wires (qbroker's ``alert`` and
  TopOSM's ``osm``); each list is taken once, and one its producer published on one wire only is relayed
  to the other (``expiry_wires``).
* A dispatch loop sends ``render`` to idle render threads whenever work or a thread becomes available.
* A liveness loop pings every registered qbroker thread; NoServer (its exclusive queue vanished with its
  process) or ``ping_misses`` unanswered pings in a row mean it died: its metatile goes back to the front.
  A thread on the ``osm`` wire is never sent anything the TopOSM protocol does not define: the broker is asked
  about its queue instead (``osm_liveness``): gone, or unconsumed ``ping_misses`` times in a row, is dead.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from qbroker import (
    CallTimeout,
    ErrorInfo,
    HandlerCrashed,
    NoServer,
    QBrokerError,
    RequestContext,
    RequestError,
    RequestFailed,
    Unit,
    UnknownCommand,
)
from services.toposm.contract import ALL_PROGRAMS, EXPIRE_TOPIC, QUEUEMASTER, Command
from services.toposm.expiry_wires import (
    OsmPublisher,
    TwinFilter,
    Wire,
    expiry_key,
    expiry_text,
    new_expiry_key,
    publish_expiry,
    relay_expiry,
)
from services.toposm.messages import Message, RenderCommand
from services.toposm.metrics_port import service_metrics
from services.toposm.seed_wire import ReplyQueues
from services.toposm.tilemath import Metatile

from .commands import COMMANDS, QueuemasterCommand, expire_broadcast
from .metrics import NAMESPACE, QueuemasterMetrics
from .osm_liveness import QueueLiveness
from .osm_wire import OsmWire, error_result
from .render_threads import RenderThread
from .state_machine import Queuemaster, request_deadline
from .waiter_store import StoredWaiter, WaiterStore

log = structlog.get_logger("toposm.queuemaster")
APP = QUEUEMASTER
ONLINE = {"command": Command.QUEUEMASTER_ONLINE}


class QueuemasterService:
    """The bus adapter around a ``Queuemaster`` state machine; the caller owns (and closes) the machine."""

    def __init__(self, unit: Unit, qm: Queuemaster) -> None:
        self.unit = unit
        self.qm = qm
        self.settings = qm.settings
        # Its own connection to the state file: a write there must not wait on the queue's open group
        # transaction (one writer at a time), so the queue commits first.
        self.waiter_store = WaiterStore(qm.settings.state_file, before_write=qm.commits.flush)
        # Read now, before the unit starts consuming: a `render` served between the unit's start and
        # ours would otherwise be taken for a previous run's and answered twice.
        self._restored = self.waiter_store.take_live()
        self.osm = OsmWire(
            qm,
            self._on_osm_expiry,
            max_body_bytes=unit.config.max_body_bytes,
            waiters=self.waiter_store,
            queue_arguments=unit.config.durable_queue_type(),
            reply_queues=ReplyQueues(unit.config),
        )
        self.osm_publisher = OsmPublisher()  # relays expiries heard on alert only
        self.expiry_twins = TwinFilter()
        qm.announce_expiry = self._announce_expiry
        # Set once the unit has started: its consumers run during its start (a command may come in before),
        # but it publishes alerts only from then on.
        self._publishing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[None]] = set()
        # This run's waiting requests on the qbroker endpoint: their row in the waiter store -> their handler
        self._waiting: dict[int, asyncio.Task[Any]] = {}
        self.metrics_server = service_metrics(NAMESPACE, qm.settings.metrics_port, qm.settings.metrics_host)
        self.metrics = QueuemasterMetrics(qm, self.metrics_server.registry)
        self.metrics_server.refreshers.append(self.metrics.refresh)
        self.metrics_server.instrument(unit)
        endpoint = unit.commands(QUEUEMASTER, prefetch=256)
        for command in COMMANDS.values():
            endpoint.command(command.name, request=command.request)(self._endpoint_handler(command))
        unit.on_alert(EXPIRE_TOPIC)(self._on_expire)
        unit.on_connected(self.osm.declare)
        unit.on_connected(self.osm_publisher.declare)

    def _endpoint_handler(self, command: QueuemasterCommand) -> Callable[..., Coroutine[Any, Any, Any]]:
        async def handle(request: Message, ctx: RequestContext) -> Any:
            stored: int | None = None
            if command.long_running:
                if ctx.reply_to and ctx.message_id:
                    # On disk before the ack: after a SIGKILL the broker has nothing left to redeliver.
                    stored = self.waiter_store.add(
                        command.name, request.model_dump_json(), ctx.reply_to, ctx.message_id, ctx.user_id, ctx.deadline
                    )
                await ctx.detach()
            request_deadline.set(ctx.deadline)  # this handler's own task context: render waits end with it
            handler = asyncio.current_task()
            if stored is not None and handler is not None:
                self._waiting[stored] = handler
            del handler  # kept by this frame, it would make a cycle with a cancelled task's exception
            try:
                return await command.run(self.qm, request, ctx.reply_to, ctx.user_id)
            except asyncio.CancelledError:
                stored = None  # a stop answers it from its row, or keeps the row for the next run
                raise
            finally:
                if stored is not None:
                    self._waiting.pop(stored, None)
                    self._forget_waiter(stored)

        return handle

    async def _on_expire(self, body: Any, ctx: RequestContext) -> None:
        await self._expiry_heard(body, ctx.message_id, "alert")

    async def _on_osm_expiry(self, body: bytes, message_id: str | None) -> None:
        await self._expiry_heard(body, message_id, "osm")

    async def _expiry_heard(self, body: Any, message_id: str | None, wire: Wire) -> None:
        """Taken once whichever wire it came by first; relayed to the other wire unless already there."""
        text = expiry_text(body)
        twins = self.expiry_twins.twins
        if text is not None and not self.expiry_twins.first(expiry_key(message_id, text), wire):
            if self.expiry_twins.twins > twins:  # else a copy of our own `expire` broadcast
                self.qm.stats.count("expiry_twins")  # the other wire's copy of one already taken
            return
        await expire_broadcast(self.qm, body)
        if text is None:
            return
        try:
            await self._publishing.wait()
            await relay_expiry(self.unit, self.osm_publisher, text, message_id, wire)
        except Exception as exc:  # the list is taken here; only the other wire's listeners miss it
            log.warning("expiry not relayed", heard_on=wire, error=str(exc))

    async def _announce_expiry(self, text: str) -> None:
        """A list taken by the `expire` command, on both wires; neither copy is taken again here."""
        key = new_expiry_key()
        self.expiry_twins.mine(key)
        await self._publishing.wait()
        await publish_expiry(self.unit, self.osm_publisher, text, key)

    # -- dispatch -------------------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            await self.qm.work_available.wait()
            self.qm.work_available.clear()
            for thread, metatile in self.qm.next_assignments():
                self._call_soon(self._send_render(thread, metatile))

    def _call_soon(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _send_render(self, thread: RenderThread, metatile: Metatile) -> None:
        sent = time.monotonic()
        try:
            if thread.wire == "osm":
                await self.osm.send_render(thread, metatile)  # the `osm` wire: no answer but `rendered`
            else:
                await self.unit.call(
                    thread.endpoint,
                    RenderCommand(metatile=str(metatile)).body(),
                    timeout=self.settings.dispatch_timeout,
                )
        except NoServer:
            self.qm.thread_lost(thread, "no_server on render")
        except RequestFailed as exc:  # refused (busy, stopping): put back, let pings tell its state
            log.warning("render refused", renderer=thread.endpoint, metatile=str(metatile), error=str(exc))
            self.qm.dispatch_refused(thread, metatile)
        except QBrokerError as exc:  # timeout or connection trouble: we cannot know; treat it as gone
            self.qm.thread_lost(thread, f"render not accepted: {exc}")
        else:
            self.metrics.dispatch.observe(time.monotonic() - sent)
            if thread.metatile == metatile:
                thread.pending = False

    # -- liveness -------------------------------------------------------------------------------------

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.ping_interval)
            for thread in self.qm.threads:
                if not thread.ping_in_flight:
                    self._call_soon(self._ping(thread))

    async def _ping(self, thread: RenderThread) -> None:
        # NoServer (the exclusive queue vanished with the process) is the fast, usual death signal; the
        # generous timeout only catches hung processes, and must not fire on a merely busy machine.
        thread.ping_in_flight = True
        timeout = max(self.settings.ping_interval * 3, 5.0)
        try:
            if thread.wire == "osm":
                await self._check_osm_thread(thread)
                return
            reply: Any = await self.unit.call(thread.endpoint, {"command": Command.PING}, timeout=timeout)
        except NoServer:
            self.qm.thread_lost(thread, "no_server on ping")
            return
        except (CallTimeout, QBrokerError) as exc:
            self._missed(thread, f"pings unanswered: {exc}")
            return
        finally:
            thread.ping_in_flight = False
            self.qm.stats.count("liveness_checks")
        thread.missed_pings = 0
        # A thread refused as busy stays out of rotation until it says it is idle.
        if thread.pending and thread.metatile is None and isinstance(reply, dict) and reply.get("state") == "idle":
            thread.pending = False
            self.qm.work_available.set()

    async def _check_osm_thread(self, thread: RenderThread) -> None:
        """An ``osm``-wire thread: the broker's word on its queue. A failed probe (our own connection's
        trouble) says nothing about the thread: it is neither a miss nor a death."""
        try:
            state = await self.osm.liveness(thread)
        except Exception as exc:
            log.warning("osm liveness probe failed", renderer=thread.endpoint, error=str(exc))
            return
        if state is QueueLiveness.GONE:
            self.qm.thread_lost(thread, f"its queue {thread.reply_to} is gone")
        elif state is QueueLiveness.UNCONSUMED:
            self._missed(thread, f"nobody consumes its queue {thread.reply_to}")
        else:
            thread.missed_pings = 0

    def _missed(self, thread: RenderThread, why: str) -> None:
        thread.missed_pings += 1
        if thread.missed_pings >= self.settings.ping_misses:
            self.qm.thread_lost(thread, f"{thread.missed_pings} liveness checks missed: {why}")

    # -- lifecycle ------------------------------------------------------------------------------------

    def _forget_waiter(self, waiter_id: int) -> None:
        try:
            self.waiter_store.remove(waiter_id)
        except sqlite3.Error as exc:  # answered anyway; at worst answered again after a restart
            log.warning("waiter row not removed", error=str(exc))

    async def _answer_restored(self, waiter: StoredWaiter) -> None:
        """A request a previous run acked but never answered: run it again and reply ourselves."""
        body: Any = None
        error: ErrorInfo | None = None
        command = COMMANDS.get(waiter.command)
        request_deadline.set(waiter.deadline)
        try:
            if command is None:
                raise UnknownCommand(f"unknown command {waiter.command!r}")
            request = command.request.model_validate_json(waiter.body)
            body = await command.run(self.qm, request, waiter.reply_to, waiter.user_id)
        except QBrokerError as exc:
            error = exc.to_info(part=QUEUEMASTER)
        except Exception as exc:  # a stored row we cannot run: answer, don't loop on it at every start
            log.exception("restored request failed", command=waiter.command)
            error = HandlerCrashed(f"unhandled {type(exc).__name__} in {QUEUEMASTER}").to_info(part=QUEUEMASTER)
        if waiter.wire == "osm":  # asked on the `osm` wire: answered there, as raw JSON
            result = body if error is None else error_result(waiter.command, error)
            await self.osm.reply_to(waiter.reply_to, waiter.message_id, result)
        else:
            await self.unit.bus.send_reply(waiter.reply_to, waiter.message_id, body, error)
        self._forget_waiter(waiter.id)

    async def start(self) -> None:
        self._publishing.set()
        restored, self._restored = self._restored, []
        for waiter in restored:
            self._call_soon(self._answer_restored(waiter))
        if restored:
            log.info("answering requests waiting before the restart", count=len(restored))
        self.qm.commits.start()
        self._tasks = [asyncio.create_task(self._dispatch_loop()), asyncio.create_task(self._liveness_loop())]
        await self.announce()
        self.metrics_server.start()
        log.info(
            "queuemaster online",
            tile_root=str(self.settings.tile_root),
            state_file=str(self.settings.state_file),
            queued=self.qm.queue.queued_count(),
        )

    async def announce(self) -> None:
        """Tell every renderer to (re)register: on `toposm` (qbroker) and on the osm exchange."""
        await self.unit.alert(ALL_PROGRAMS, ONLINE)
        await self.osm.publish_online()

    async def stop(self) -> None:
        """Stop dispatching and answer every waiting ``render`` while the unit can still reply."""
        for task in [*self._tasks, *self._calls]:
            task.cancel()
        await self.metrics_server.stop()
        await self.osm.stop()
        await self._answer_stopped()
        self.qm.fail_waiters()
        self.qm.commits.flush()

    async def _answer_stopped(self) -> None:
        """Answer this run's waiting requests ``queuemaster_stopped`` from their rows, for up to half the
        drain timeout, keep the rows of the rest for the next run, then cancel their handlers (they unwind
        in the unit's drain, the other half).

        Not by waking each request's handler to answer for itself: woken all at once, they held the loop
        long past the drain (docs/performance.md, "Parked render requests"). Taken off the state machine
        first, no render answers them meanwhile, and a row is deleted only once its answer is out: no
        request is both unanswered and forgotten."""
        waiting, self._waiting = self._waiting, {}
        self.qm.render_waiters.forget_all()  # their handlers stay parked, costing nothing, until cancelled
        rows = self.waiter_store.replies(list(waiting))
        error = RequestError("queuemaster_stopped", "the queuemaster is shutting down").to_info(part=QUEUEMASTER)
        loop = asyncio.get_running_loop()
        until = loop.time() + self.settings.drain_timeout / 2
        answered: list[int] = []
        for waiter_id, reply_to, message_id in rows:
            if loop.time() > until:
                break
            await self.unit.bus.send_reply(reply_to, message_id, None, error, part=QUEUEMASTER)
            answered.append(waiter_id)
        for waiter_id in answered:
            self.waiter_store.remove(waiter_id)
        self.waiter_store.flush()
        for task in waiting.values():
            task.cancel()
        if rows:
            log.info("waiting requests answered at stop", answered=len(answered), kept=len(rows) - len(answered))
