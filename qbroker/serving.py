"""Serving a unit's endpoints: their queues, their broadcasts, idling, and handlers that stop making progress.

Each endpoint is consumed on a channel of its own (its prefetch is the endpoint's), at the start and after
every reconnect, and also when an endpoint is added to a running unit (RQ's consume / cancel queue at run
time). Removing one cancels its consumer: nothing new arrives, the requests in hand still finish and are
acknowledged on the channel they came on.

Idle (RQ IDLE, "an idle node gets no new work"): ``pause()`` cancels every endpoint's consumer, so the
broker gives new requests to the other servers; the requests in hand finish. ``resume()`` consumes again.

Stuck handlers (RQ PING/PONG, EventMQ heartbeats: a worker that is alive but makes no progress): with
``Config.stuck_after`` set, an endpoint whose oldest request has run longer than that has its channel
closed. The broker then hands its unacknowledged requests (the stuck one included, which counts as a failed
delivery: see ``rpc``) to other servers, and the endpoint takes no new work until its stuck handlers end;
then it consumes again.

Broadcast (RQ BROADCAST): beside load-balanced requests on ``rpc_<name>``, every server of ``name``
listens on the alert exchange for ``qbroker.broadcast.<name>`` with the same handler, so one message
reaches all of them and ``Unit.broadcast`` gathers their replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from qbroker import rpc
from qbroker.alerts import Listener
from qbroker.bus import Bus
from qbroker.context import RequestContext
from qbroker.endpoints import Endpoint
from qbroker.exchanges import declare_rpc_queue
from qbroker.transport import Channel, Connection, Queue

Track = Callable[[Awaitable[None]], Awaitable[None]]
BROADCAST_PREFIX = "qbroker.broadcast."


def broadcast_key(name: str) -> str:
    return BROADCAST_PREFIX + name


@dataclass
class _EndpointDispatch:
    endpoint: Endpoint

    async def call(self, body: Any, ctx: RequestContext) -> Any:
        return await self.endpoint.dispatch(body, ctx)


def broadcast_listener(endpoint: Endpoint) -> Listener:
    """The listener through which every server of ``endpoint.name`` answers a broadcast to it."""
    return Listener(broadcast_key(endpoint.name), _EndpointDispatch(endpoint))


@dataclass
class _Served:
    endpoint: Endpoint
    channel: Channel | None = None
    queue: Queue | None = None
    tag: str | None = None
    running: dict[int, float] = field(default_factory=dict)  # request -> when its handler started
    stuck: bool = False


class EndpointServing:
    """The endpoints of one unit on the bus (the unit keeps the registry, this keeps them consumed)."""

    def __init__(self, bus: Bus, track: Track) -> None:
        self.bus = bus
        self._track = track  # the unit's in-flight count, for draining on stop
        self._served: dict[str, _Served] = {}
        self.paused = False
        self._watchdog: asyncio.Task[None] | None = None

    async def attach(self, connection: Connection, endpoints: list[Endpoint]) -> None:
        """On every (re)connect: the old connection's consumers died with it; consume each endpoint again."""
        self._served = {}
        for endpoint in endpoints:
            await self.add(connection, endpoint)
        stuck_after = self.bus.config.stuck_after
        if stuck_after is not None and (self._watchdog is None or self._watchdog.done()):
            self._watchdog = asyncio.create_task(self._watch(stuck_after), name="qbroker-stuck-watchdog")

    async def add(self, connection: Connection, endpoint: Endpoint) -> None:
        served = self._served[endpoint.name] = _Served(endpoint)
        config, options = self.bus.config, endpoint.options
        if options.max_priority and not options.exclusive and config.queue_type == "quorum":
            self.bus.log.warning(
                "a priority endpoint's queue stays classic (quorum queues have no priorities): it is not replicated",
                queue=config.queue_name("rpc", endpoint.name),
            )
        served.channel = await self.bus.channel(connection, confirms=False)
        await served.channel.set_qos(prefetch_count=options.prefetch)
        served.queue = await declare_rpc_queue(
            connection,
            served.channel,
            config,
            endpoint.name,
            log=self.bus.log,
            exclusive=options.exclusive,
            max_priority=options.max_priority,
            single_active=options.single_active,
        )
        if not self.paused:
            await self._consume(served)

    async def remove(self, name: str) -> None:
        served = self._served.pop(name, None)
        if served is not None:
            await self._cancel(served)

    async def pause(self) -> None:
        """Idle: no new requests for any endpoint; the ones in hand finish."""
        self.paused = True
        for served in self._served.values():
            await self._cancel(served)

    async def resume(self) -> None:
        self.paused = False
        for served in self._served.values():
            if served.tag is None and not served.stuck:
                await self._consume(served)

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    # -- consuming -------------------------------------------------------------------------------------

    async def _consume(self, served: _Served) -> None:
        assert served.queue is not None
        served.tag = await self.bus.add_consumer(
            served.queue, self._consumer(served), part=served.endpoint.name, priority=served.endpoint.options.priority
        )

    async def _cancel(self, served: _Served) -> None:
        if served.queue is not None and served.tag is not None:
            tag, served.tag = served.tag, None
            await self.bus.cancel_consumer(served.queue, tag)

    def _consumer(self, served: _Served) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        async def consume(message: AbstractIncomingMessage) -> None:
            key = id(message)
            served.running[key] = time.monotonic()
            try:
                await self._track(rpc.serve_request(self.bus, served.endpoint, message))
            finally:
                served.running.pop(key, None)
                if served.stuck and not served.running:
                    await self._recover(served)

        return consume

    # -- stuck handlers --------------------------------------------------------------------------------

    async def _watch(self, stuck_after: float) -> None:
        while True:
            await asyncio.sleep(max(0.05, stuck_after / 4))
            now = time.monotonic()
            for served in list(self._served.values()):
                if not served.stuck and served.running and now - min(served.running.values()) > stuck_after:
                    await self._give_up(served, stuck_after)

    async def _give_up(self, served: _Served, stuck_after: float) -> None:
        """Close the endpoint's channel: its unacked requests go back to the broker, to other servers."""
        served.stuck = True
        self.bus.log.error(
            "handlers stuck; their requests go to other servers",
            endpoint=served.endpoint.name,
            running=len(served.running),
            stuck_after=stuck_after,
        )
        await self._cancel(served)
        if served.channel is not None:
            with contextlib.suppress(Exception):
                await served.channel.close()

    async def _recover(self, served: _Served) -> None:
        """The stuck handlers ended: take work again on a fresh channel."""
        served.stuck = False
        connection = self.bus.connection
        if connection is None or connection.is_closed or self._served.get(served.endpoint.name) is not served:
            return  # a reconnect consumes it again anyway
        self.bus.log.info("handlers unstuck; taking work again", endpoint=served.endpoint.name)
        with contextlib.suppress(Exception):
            await self.add(connection, served.endpoint)
