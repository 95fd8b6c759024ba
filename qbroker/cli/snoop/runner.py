"""The debugger's main loop: a unit for discovery, our own queues on its connection, one printer.

Deliveries from all our queues go through one in-process queue to a single processing task, so
events are handled (and printed) in the order the broker delivered them and a request is always
remembered before its reply is paired.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qbroker.cli.output import say
from qbroker.cli.snoop.bindings import SnoopQueues
from qbroker.cli.snoop.captured import Captured, from_delivery, from_trace
from qbroker.cli.snoop.directory import UnitDirectory, UnitInfo
from qbroker.cli.snoop.events import Event, decode
from qbroker.cli.snoop.filters import EventFilter
from qbroker.cli.snoop.pairing import RequestTracker
from qbroker.cli.snoop.render import Renderer
from qbroker.discovery import ORIGINAL, complete_original, unit_summary
from qbroker.errors import QBrokerError
from qbroker.exit_codes import ExitCode
from qbroker.runner import serve_async

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

    from qbroker import Config, Unit
    from qbroker.transport import Connection

ROLES = ("rpc", "reply", "alert", "dead")
REORDER_WINDOW = 0.25  # seconds a reply waits for its request before it is shown unpaired


@dataclass
class DebugSettings:
    renderer: Renderer
    event_filter: EventFilter = field(default_factory=EventFilter)
    firehose: bool = False
    everything: bool = False  # --all: bind '#' on rpc and alert
    show_own: bool = False  # show the debugger's own discovery traffic
    max_events: int | None = None
    duration: float | None = None
    discover_timeout: float = 1.0
    # Seconds between roll calls (qbroker.ping); 0 = never. A unit that misses two in a row is forgotten
    # and its endpoint names unbound: a server that died without qbroker.stop (SIGKILL, a render
    # thread's endpoint) must not stay routable through our queue, or its callers get no no_server.
    recheck_interval: float = 10.0


class Debugger:
    def __init__(self, unit: Unit, config: Config, settings: DebugSettings) -> None:
        self.unit = unit
        self.settings = settings
        self.exchanges = {role: config.exchange_name(role) for role in ROLES}  # type: ignore[arg-type]
        self.roles = {name: role for role, name in self.exchanges.items()}
        self.directory = UnitDirectory(unit.uuid, everything=settings.everything)
        self.missed: dict[str, int] = {}  # roll calls a known unit has missed in a row
        self.tracker = RequestTracker()
        self.inbox: asyncio.Queue[Captured] = asyncio.Queue()
        self.stopping = asyncio.Event()
        self.shown = 0
        self.connects = 0
        self._rediscovery: asyncio.Task[None] | None = None
        self.held: OrderedDict[str, tuple[float, Event]] = OrderedDict()  # reply correlation id -> (until, reply)
        self.queues = SnoopQueues(
            self.exchanges,
            f"{config.exchange_prefix}debug_{unit.uuid}_",
            self._deliver,
            debuggers_queue=None if settings.firehose else config.debuggers_queue_name,
        )
        unit.on_connected(self._attach)

    async def _deliver(self, message: AbstractIncomingMessage, source: str) -> None:
        try:
            captured = from_trace(message) if source == "firehose" else from_delivery(message, source)  # type: ignore[arg-type]
        except Exception as exc:  # a forged message must not end the debugger
            say(f"qbroker-debug: unreadable message ({type(exc).__name__}: {exc})", style="yellow")
            return
        if captured is not None:
            self.inbox.put_nowait(captured)

    async def _attach(self, connection: Connection) -> None:
        # Runs on every (re)connect: exclusive queues died with the old connection, so redeclare.
        await self.queues.open(connection, firehose=self.settings.firehose, desired=self.directory.desired())
        self.connects += 1
        if self.connects > 1:
            # Units may have started or stopped while we were away; ask again once the unit is ready
            # (this hook runs before the unit counts as connected, so not inline).
            self._rediscovery = asyncio.create_task(self._rediscover())

    async def _rediscover(self) -> None:
        if await self.unit.wait_connected(30):
            say("qbroker-debug: reconnected; messages sent meanwhile were not seen", style="yellow")
            with contextlib.suppress(QBrokerError):
                await self.discover()

    async def discover(self) -> None:
        """Follow the units already running: they all answer ``qbroker.ping``."""
        await self.roll_call(forget_missing=False)

    async def roll_call(self, *, forget_missing: bool = True) -> None:
        """Ping every unit; learn what answers (its endpoints now), forget what missed two roll calls."""
        answered: set[str] = set()
        summaries = []
        async for reply in self.unit.gather("qbroker.ping", {}, timeout=self.settings.discover_timeout):
            summary = unit_summary(reply.body, reply.header.content_type)
            if summary is not None and summary["uuid"] != self.unit.uuid:
                summaries.append(summary)
        # The original QBroker's units say their endpoints only when asked one by one.
        await complete_original(self.unit.bus, summaries, self.settings.discover_timeout or 1.0)
        for summary in summaries:
            unit = self._learn(summary)
            if unit is not None:
                answered.add(unit.uuid)
        if forget_missing:
            for uuid in list(self.directory.units):
                if uuid in answered:
                    self.missed.pop(uuid, None)
                    continue
                self.missed[uuid] = self.missed.get(uuid, 0) + 1
                if self.missed[uuid] >= 2:
                    self.missed.pop(uuid, None)
                    self.directory.forget(uuid)
        await self.queues.sync(self.directory.desired())

    def _learn(self, summary: dict[str, Any]) -> UnitInfo | None:
        """Learn a unit from its ping answer; an original unit that did not say its endpoints (an answer to
        an alert ping, or it did not answer the question on rpc) keeps those learnt before."""
        known = self.directory.units.get(summary["uuid"])
        if known is not None and summary.get("dialect") == ORIGINAL and "endpoints" not in summary:
            return known
        return self.directory.learn(summary)

    async def recheck_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.recheck_interval)
            with contextlib.suppress(QBrokerError):
                await self.roll_call()

    async def run(self) -> None:
        deadline = time.monotonic() + self.settings.duration if self.settings.duration else None
        stop_waiter = asyncio.ensure_future(self.stopping.wait())
        try:
            while not self.stopping.is_set():
                await self._release_held(time.monotonic())
                if not self.inbox.empty():
                    # Busy bus: take what is queued without creating wait tasks per message.
                    await self.handle(self.inbox.get_nowait())
                    continue
                now = time.monotonic()
                timeout = None if deadline is None else deadline - now
                if timeout is not None and timeout <= 0:
                    break
                if self.held:
                    release = next(iter(self.held.values()))[0] - now
                    timeout = release if timeout is None else min(timeout, release)
                getter = asyncio.ensure_future(self.inbox.get())
                done, _ = await asyncio.wait(
                    {getter, stop_waiter},
                    timeout=max(0.0, timeout) if timeout is not None else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter in done:
                    await self.handle(getter.result())
                else:
                    getter.cancel()
        finally:
            stop_waiter.cancel()
        await self._release_held(None)  # already received: show them rather than drop them

    async def handle(self, captured: Captured) -> None:
        """Show one delivery; a message we cannot make sense of is reported, never fatal."""
        try:
            await self._handle(captured)
        except Exception as exc:
            say(
                f"qbroker-debug: could not show a message from {captured.exchange or '?'}:"
                f"{captured.routing_key} ({type(exc).__name__}: {exc})",
                style="yellow",
            )

    async def _handle(self, captured: Captured) -> None:
        event = decode(captured, self.roles)
        if event is None:
            return
        await self._follow(event)
        if event.kind == "reply" and event.correlation_id and not self.tracker.knows(event.correlation_id):
            # RabbitMQ orders messages per publishing channel only: on a busy broker a reply can
            # reach our queue just before the request it answers. Hold it briefly for its request.
            self.held[event.correlation_id] = (time.monotonic() + REORDER_WINDOW, event)
            return
        await self._complete_and_show(event)
        held = self.held.pop(event.message_id, None) if event.message_id else None
        if held is not None and event.kind in ("request", "alert", "dead"):
            await self._complete_and_show(held[1])

    async def _release_held(self, now: float | None) -> None:
        """Show held replies whose request did not turn up in time (all of them when ``now`` is None)."""
        while self.held:
            key, (release_at, event) = next(iter(self.held.items()))
            if now is not None and release_at > now:
                return
            del self.held[key]
            await self._complete_and_show(event)

    async def _complete_and_show(self, event: Event) -> None:
        self.tracker.observe(event)
        if event.kind == "reply":
            event.to_app = event.to_app or self.directory.app_of(event.to_uuid)
            summary = unit_summary(event.body, event.content_type) if event.name == "qbroker.ping" else None
            # Someone else's ping (e.g. `qbroker list`) refreshes what we know for free.
            if summary is not None and self._learn(summary) is not None:
                await self.queues.sync(self.directory.desired())
        event.app = event.app or self.directory.app_of(event.uuid)
        if self._is_own(event) and not self.settings.show_own:
            return
        if not self.settings.event_filter(event):
            return
        if self.settings.max_events is not None and self.shown >= self.settings.max_events:
            return
        self.settings.renderer.show(event)
        self.shown += 1
        if self.settings.max_events is not None and self.shown >= self.settings.max_events:
            self.stopping.set()

    async def _follow(self, event: Event) -> None:
        """Keep bindings in step with the bus: new units, stopped units, unknown callers."""
        changed = False
        if event.kind == "alert" and isinstance(event.body, dict):
            if event.name == "qbroker.start":
                changed = self.directory.learn(event.body) is not None
            elif event.name == "qbroker.stop":
                changed = self.directory.forget(event.body.get("uuid") or event.uuid) is not None
        elif event.kind == "request":
            changed = self.directory.follow_caller(event.reply_to)
        if changed:
            await self.queues.sync(self.directory.desired())
        if event.kind == "alert" and event.name == "qbroker.start" and event.reply_to and event.message_id:
            # The unit waits for this before it goes on: from now on its replies reach our queue.
            await self.unit.bus.send_reply(event.reply_to, event.message_id, {"debugger": self.unit.uuid}, None)

    def _is_own(self, event: Event) -> bool:
        own = self.unit.uuid
        return own in (event.uuid, event.to_uuid, event.reply_to)

    def summary(self) -> dict[str, Any]:
        return {
            "units": len(self.directory.units),
            "endpoints": len(self.queues.bound("rpc")),
            "queues": self.queues.names,
        }


class DebuggerService:
    """The debugger as a ``qbroker.runner.Service``: discover, then print until stopped or done.

    ``debugger.stopping`` is the runner's stop event: a signal sets it, and so does the debugger
    itself when ``--count`` or ``--duration`` is reached.
    """

    def __init__(self, debugger: Debugger) -> None:
        self.debugger = debugger
        self._printing: asyncio.Task[None] | None = None
        self._recheck: asyncio.Task[None] | None = None

    async def start(self) -> None:
        debugger = self.debugger
        await debugger.discover()
        info = debugger.summary()
        if debugger.settings.firehose:
            following = f"firehose (amq.rabbitmq.trace), {info['units']} unit(s) known"
        else:
            following = f"own queues, {info['units']} unit(s), {info['endpoints']} endpoint(s)"
        say(f"qbroker-debug: watching via {following}; queues {', '.join(info['queues'])}; Ctrl-C to stop", style="dim")
        self._printing = asyncio.create_task(debugger.run(), name="qbroker-debug-printer")
        self._printing.add_done_callback(lambda _: debugger.stopping.set())
        if debugger.settings.recheck_interval > 0 and not debugger.settings.firehose:
            self._recheck = asyncio.create_task(debugger.recheck_loop(), name="qbroker-debug-recheck")

    async def stop(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
        self.debugger.stopping.set()
        try:
            if self._printing is not None:
                await self._printing
        finally:
            await self.debugger.queues.close()


async def run_debugger(unit: Unit, config: Config, settings: DebugSettings) -> int:
    debugger = Debugger(unit, config, settings)
    graceful = await serve_async(unit, DebuggerService(debugger), stop=debugger.stopping)
    if not graceful:
        return int(ExitCode.INTERRUPTED)  # killed by a second Ctrl-C: the shell's convention for SIGINT
    say(f"qbroker-debug: {debugger.shown} message(s) shown; queues removed", style="dim")
    return 0
