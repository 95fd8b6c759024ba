"""Serving an endpoint: consuming its ``rpc_<name>`` queue on its own channel, and its broadcasts.

A unit consumes each endpoint on a channel of its own (its prefetch is the endpoint's), at the start and
after every reconnect, and also when an endpoint is added to a running unit (RQ's consume / cancel queue
at run time). Removing one cancels its consumer: nothing new arrives, the requests in hand still finish
and are acknowledged on the channel they came on; the channel is closed once the unit closes.

Broadcast (RQ BROADCAST): beside load-balanced requests on ``rpc_<name>``, every server of ``name``
listens on the alert exchange for ``qbroker.broadcast.<name>`` with the same handler, so one message
reaches all of them and ``Unit.broadcast`` gathers their replies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from qbroker.alerts import Listener
from qbroker.bus import Bus
from qbroker.context import RequestContext
from qbroker.endpoints import Endpoint
from qbroker.exchanges import declare_rpc_queue, rpc_queue_takes_expiry
from qbroker.transport import Channel, Connection, Queue

RequestConsumer = Callable[[Any], Awaitable[None]]
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
class EndpointConsumer:
    channel: Channel
    queue: Queue
    tag: str


async def consume_endpoint(bus: Bus, connection: Connection, endpoint: Endpoint,
                           consumer: RequestConsumer) -> EndpointConsumer:
    config, options = bus.config, endpoint.options
    expires = not options.exclusive and await rpc_queue_takes_expiry(
        connection, config, endpoint.name, max_priority=options.max_priority, single_active=options.single_active)
    if not expires and not options.exclusive and config.rpc_queue_expiry is not None:
        bus.log.warning("rpc queue exists without x-expires (declared by an older qbroker): a stopped "
                        "service will time out instead of answering no_server until it is deleted",
                        queue=config.queue_name("rpc", endpoint.name))
    channel = await bus.channel(connection, confirms=False)
    await channel.set_qos(prefetch_count=options.prefetch)
    queue = await declare_rpc_queue(
        channel, config, endpoint.name, exclusive=options.exclusive,
        max_priority=options.max_priority, single_active=options.single_active, expires=expires,
    )
    tag = await bus.add_consumer(queue, consumer, part=endpoint.name, priority=options.priority)
    return EndpointConsumer(channel, queue, tag)


async def stop_consuming_endpoint(bus: Bus, consumer: EndpointConsumer) -> None:
    await bus.cancel_consumer(consumer.queue, consumer.tag)
