"""Declaring the QBroker exchanges and queues (seed: qbroker-amqp-structure.rst).

- ``rpc``   topic, routing key = request name; alternate exchange ``dead`` catches unroutable requests.
- ``reply`` direct, routing key = the caller's uuid.
- ``alert`` topic, routing key = alert name; alternate exchange ``dead`` so unheard alerts are counted.
- ``dead``  fanout, with the durable ``dead`` queue bound to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from aio_pika import ExchangeType

from qbroker.config import Config
from qbroker.transport import Channel, Exchange, Queue


@dataclass(frozen=True)
class Exchanges:
    rpc: Exchange
    reply: Exchange
    alert: Exchange
    dead: Exchange


async def declare_exchanges(channel: Channel, config: Config) -> Exchanges:
    dead_name = config.exchange_name("dead")
    dead = await channel.declare_exchange(dead_name, ExchangeType.FANOUT, durable=True)
    await (await declare_dead_queue(channel, config)).bind(dead)
    rpc = await channel.declare_exchange(
        config.exchange_name("rpc"), ExchangeType.TOPIC, durable=True,
        arguments={"alternate-exchange": dead_name},
    )
    reply = await channel.declare_exchange(config.exchange_name("reply"), ExchangeType.DIRECT, durable=True)
    alert = await channel.declare_exchange(
        config.exchange_name("alert"), ExchangeType.TOPIC, durable=True,
        arguments={"alternate-exchange": dead_name},
    )
    return Exchanges(rpc=rpc, reply=reply, alert=alert, dead=dead)


async def declare_dead_queue(channel: Channel, config: Config) -> Queue:
    """The shared ``dead`` queue; every declaration must carry the same arguments or the broker refuses it."""
    return await channel.declare_queue(
        config.dead_queue_name, durable=True, arguments={"x-message-ttl": config.dead_queue_ttl_ms}
    )


def rpc_queue_arguments(config: Config, *, max_priority: int | None, single_active: bool) -> dict[str, Any]:
    """Arguments of ``rpc_<name>``: expired or rejected requests are dead-lettered to ``dead``."""
    args: dict[str, Any] = {"x-dead-letter-exchange": config.exchange_name("dead")}
    if max_priority:
        args["x-max-priority"] = max_priority
    if single_active:
        args["x-single-active-consumer"] = True
    return args


async def declare_rpc_queue(
    channel: Channel,
    config: Config,
    name: str,
    *,
    exclusive: bool = False,
    max_priority: int | None = None,
    single_active: bool = False,
) -> Queue:
    """``rpc_<name>``, shared by every server of ``name``; per-instance endpoints are exclusive."""
    queue = await channel.declare_queue(
        config.queue_name("rpc", name),
        durable=not exclusive,
        exclusive=exclusive,
        auto_delete=exclusive,
        arguments=rpc_queue_arguments(config, max_priority=max_priority, single_active=single_active),
    )
    await queue.bind(config.exchange_name("rpc"), routing_key=name)
    return queue


async def declare_unit_queue(channel: Channel, config: Config, kind: Literal["reply", "alert"],
                             uuid: str) -> Queue:
    """``reply_<uuid>`` / ``alert_<uuid>``: the unit's own non-persistent queues."""
    return await channel.declare_queue(
        config.queue_name(kind, uuid), durable=False, exclusive=True, auto_delete=True
    )
