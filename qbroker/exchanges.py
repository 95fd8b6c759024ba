"""Declaring the QBroker exchanges and queues (seed: qbroker-amqp-structure.rst).

- ``rpc``   topic, routing key = request name; alternate exchange ``dead`` catches unroutable requests.
- ``reply`` direct, routing key = the caller's uuid.
- ``alert`` topic, routing key = alert name; alternate exchange ``dead`` so unheard alerts are counted.
- ``dead``  fanout, with the durable ``dead`` queue bound to it.
- ``dead.kept.in`` fanout, with the durable ``dead.kept`` queue bound to it, which nobody consumes: the
  collector that takes a dead request copies it there, for operators to list and replay (``dead_kept``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal

from aio_pika import ExchangeType
from aio_pika.exceptions import ChannelPreconditionFailed

from qbroker.config import Config
from qbroker.transport import Channel, Connection, Exchange, Queue


@dataclass(frozen=True)
class Exchanges:
    rpc: Exchange
    reply: Exchange
    alert: Exchange
    dead: Exchange


async def declare_exchanges(connection: Connection, channel: Channel, config: Config) -> Exchanges:
    """The four exchanges, the ``dead`` queue and ``dead.kept`` (its collectors say when it has other bounds)."""
    dead_name = config.exchange_name("dead")
    dead = await channel.declare_exchange(dead_name, ExchangeType.FANOUT, durable=True)
    await (await declare_dead_queue(channel, config)).bind(dead)
    await declare_dead_kept(connection, channel, config)
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
        config.dead_queue_name, durable=True,
        arguments={"x-message-ttl": config.dead_queue_ttl_ms, **config.durable_queue_type()},
    )


def dead_kept_arguments(config: Config) -> dict[str, Any]:
    return {"x-max-length": config.dead_kept_max, "x-max-length-bytes": config.dead_kept_max_bytes,
            "x-message-ttl": config.dead_kept_ttl_ms, "x-overflow": "drop-head", **config.durable_queue_type()}


async def declare_dead_kept(connection: Connection, channel: Channel, config: Config) -> tuple[Exchange, bool]:
    """The exchange and queue of the copies kept for operators (``qbroker dead``), bounded by count, bytes and
    age. Returns the exchange, where collectors publish the copies, and whether the queue was found with
    other bounds (declared by an older qbroker, or by units configured otherwise): it is then used as it is
    rather than refusing to start every unit on the bus (deleting it once, or a policy, applies the new
    bounds). The declare runs on a throwaway channel: the broker refuses a re-declare with other arguments
    by closing the channel."""
    exchange = await channel.declare_exchange(config.dead_kept_exchange_name, ExchangeType.FANOUT, durable=True)
    for arguments in (dead_kept_arguments(config), None):
        probe = await connection.channel(publisher_confirms=False)
        try:
            queue = await probe.declare_queue(config.dead_kept_queue_name, durable=True,
                                              passive=arguments is None, arguments=arguments)
            await queue.bind(exchange.name)
        except ChannelPreconditionFailed:
            continue  # the broker closed this channel
        finally:
            if not probe.is_closed:
                await probe.close()
        return exchange, arguments is None
    raise AssertionError("unreachable: a passive declare does not compare arguments")  # pragma: no cover


def rpc_queue_arguments(config: Config, *, max_priority: int | None, single_active: bool,
                        expires: bool = True, exclusive: bool = False) -> dict[str, Any]:
    """Arguments of ``rpc_<name>``: expired or rejected requests are dead-lettered to ``dead``; the
    queue itself goes ``rpc_queue_expiry`` seconds after its last consumer (see Config). A shared one is a
    quorum queue when the config says so, unless it has priorities (``Config.queue_type``)."""
    args: dict[str, Any] = {"x-dead-letter-exchange": config.exchange_name("dead")}
    if not exclusive and not max_priority:
        args.update(config.durable_queue_type())
    if expires and config.rpc_queue_expiry is not None:
        args["x-expires"] = max(1, round(config.rpc_queue_expiry * 1000))
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
    expires: bool = True,
) -> Queue:
    """``rpc_<name>``, shared by every server of ``name``; per-instance endpoints are exclusive."""
    queue = await channel.declare_queue(
        config.queue_name("rpc", name),
        durable=not exclusive,
        exclusive=exclusive,
        auto_delete=exclusive,
        arguments=rpc_queue_arguments(config, max_priority=max_priority, single_active=single_active,
                                      expires=expires and not exclusive, exclusive=exclusive),
    )
    await queue.bind(config.exchange_name("rpc"), routing_key=name)
    return queue


async def declare_unit_queue(channel: Channel, config: Config, kind: Literal["reply", "alert"],
                             uuid: str) -> Queue:
    """``reply_<uuid>`` / ``alert_<uuid>``: the unit's own non-persistent queues (a durable reply queue when
    ``config.durable_reply_queue``: see Config)."""
    if kind == "reply" and config.durable_reply_queue:
        return await channel.declare_queue(
            config.queue_name(kind, uuid), durable=True, exclusive=False, auto_delete=False,
            arguments={"x-expires": int(config.reply_queue_expiry * 1000), **config.durable_queue_type()},
        )
    return await channel.declare_queue(
        config.queue_name(kind, uuid), durable=False, exclusive=True, auto_delete=True
    )


async def rpc_queue_takes_expiry(connection: Connection, config: Config, name: str, *,
                                 max_priority: int | None, single_active: bool) -> bool:
    """Whether ``rpc_<name>`` can be declared with ``x-expires``: False when it exists already without
    it (declared by an older qbroker). The broker refuses a re-declare with other arguments by closing
    the channel, so this probes on a throwaway channel rather than the unit's own."""
    if config.rpc_queue_expiry is None:
        return False
    for expires in (True, False):
        channel = await connection.channel(publisher_confirms=False)
        try:
            await channel.declare_queue(
                config.queue_name("rpc", name), durable=True,
                arguments=rpc_queue_arguments(config, max_priority=max_priority, single_active=single_active,
                                              expires=expires),
            )
        except ChannelPreconditionFailed:
            continue  # the broker closed this channel
        with contextlib.suppress(Exception):
            await channel.close()
        return expires
    # Some other argument conflicts too: the real declaration (with expiry) reports it.
    return True
