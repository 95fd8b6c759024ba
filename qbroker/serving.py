"""Consuming one endpoint's ``rpc_<name>`` queue on its own channel, and stopping that again.

A unit consumes each endpoint on a channel of its own (its prefetch is the endpoint's), at the start and
after every reconnect, and also when an endpoint is added to a running unit (RQ's consume / cancel queue
at run time). Removing one cancels its consumer: nothing new arrives, the requests in hand still finish
and are acknowledged on the channel they came on; the channel is closed once the unit closes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from qbroker.bus import Bus
from qbroker.endpoints import Endpoint
from qbroker.exchanges import declare_rpc_queue, rpc_queue_takes_expiry
from qbroker.transport import Channel, Connection, Queue

RequestConsumer = Callable[[Any], Awaitable[None]]


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
