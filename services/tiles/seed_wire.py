"""The seed's literal wire (toposm-message-protocol.md): its exchange and reply queues, for every program
that speaks it (the names are the TopOSM contract's, ``contract``).

All communication is on the topic exchange ``osm``; expirations go to ``expire_toposm``; every program
listens on ``toposm``; render threads listen on every level of ``toposm.render.<host>.<pid>.<id>``. Commands
carry a ``reply_to`` that is a *queue* the sender consumes from: answers go there through the default
exchange. Which queue names we accept as such is defined here (``client_reply_queue``), because the default
exchange reaches any queue by name, the bus's own included.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import orjson
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractIncomingMessage

from qbroker import Unit
from qbroker.topology import topic_exchange
from qbroker.topology_check import ensure_shared
from qbroker.transport import Connection

from .contract import ALL_PROGRAMS, CLIENT_REPLY_PREFIX, OSM_EXCHANGE

log = structlog.get_logger("toposm.seed_wire")

# A client's reply queue on the seed's wire: one the broker named (``amq.gen-...``, what a client gets by
# declaring ""), or one of the documented client prefix ``toposm.reply.<word>`` (a seed program that wants
# a name of its own). Nothing else: not ``dead``, ``rpc_*``, ``reply_<uuid>``, a renderer's or the
# queuemaster's queue, which an answer published by name would otherwise fill.
_CLIENT_REPLY_QUEUE = re.compile(rf"amq\.gen-[A-Za-z0-9_-]{{1,128}}|"
                                 rf"{re.escape(CLIENT_REPLY_PREFIX)}[A-Za-z0-9_-]{{1,128}}")


def client_reply_queue(name: str | None) -> bool:
    """Whether ``name`` is shaped like a client's reply queue on the seed's wire (see above)."""
    return name is not None and _CLIENT_REPLY_QUEUE.fullmatch(name) is not None


# The one declaration of `osm` (docs/tiles.md): `qbroker provision` declares it so, a unit finds it
# (declaring it only where its account may, on a bus without accounts), and what differs is named with its cost.
OSM = topic_exchange(OSM_EXCHANGE, costs={
    "durable": "it is gone after a broker restart with its bindings (the queuemaster's durable queue then misses "
               "what is published on osm) until a program declares it again; a seed program declares it durable "
               "or passively (docs/tiles.md)"})


async def declare_osm_exchange(connection: AbstractConnection) -> tuple[AbstractChannel, AbstractExchange]:
    """A channel and the ``osm`` topic exchange: found (or declared where the account may) as ``OSM`` says,
    or used as it is when a seed program declared it otherwise (each difference logged with its cost).
    Missing on a bus whose accounts may not declare it: TopologyMissing, naming it and ``qbroker provision``."""
    await ensure_shared(cast(Connection, connection), [OSM], log)
    channel = await connection.channel()
    return channel, await channel.get_exchange(OSM_EXCHANGE, ensure=False)


def seed_command(body: bytes) -> dict[str, Any] | None:
    """A seed command (a JSON object with a string ``command``), or None for anything else."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and isinstance(parsed.get("command"), str) else None


class OsmListener:
    """A program's own queue on ``osm``, as a program written from the seed has one: broker-named and
    exclusive (gone with the connection, which is how the queuemaster tells a render thread died), bound to
    ``keys`` (``toposm`` for every program). ``unit.on_connected(listener.declare)``; every message is acked
    after ``handle``, whatever it does (a failure is logged: one bad message must not stop the consumer).
    ``queue_name`` is the queue, the ``reply_to`` of what the program sends on this wire; ``exchange``
    publishes there."""

    def __init__(self, keys: Sequence[str], handle: Callable[[AbstractIncomingMessage], Awaitable[None]],
                 *, prefetch: int = 64) -> None:
        self.keys = list(keys)
        self._handle = handle
        self._prefetch = prefetch
        self.queue_name: str | None = None
        self.exchange: AbstractExchange | None = None

    async def declare(self, transport_connection: Connection) -> None:
        channel, exchange = await declare_osm_exchange(cast(AbstractConnection, transport_connection))
        await channel.set_qos(prefetch_count=self._prefetch)
        queue = await channel.declare_queue("", exclusive=True)
        for key in self.keys:
            await queue.bind(exchange, routing_key=key)
        self.queue_name, self.exchange = queue.name, exchange
        await queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            await self._handle(message)
        except Exception:
            log.exception("osm message failed", routing_key=message.routing_key)
        finally:
            await message.ack()


def hear_all_programs(unit: Unit, on_command: Callable[[dict[str, Any]], Awaitable[None]]) -> OsmListener:
    """Listen on ``toposm``, where the seed says every running program listens, on both wires: qbroker's
    ``alert`` exchange and a queue of the unit's own on ``osm``. ``on_command`` gets each seed command
    (a JSON object with a string ``command``) heard there; anything else is dropped. Before ``unit.start()``."""

    async def on_alert(body: Any) -> None:
        if isinstance(body, dict) and isinstance(body.get("command"), str):
            await on_command(body)

    async def on_osm(message: AbstractIncomingMessage) -> None:
        command = seed_command(message.body)
        if command is not None:
            await on_command(command)

    unit.on_alert(ALL_PROGRAMS)(on_alert)
    listener = OsmListener([ALL_PROGRAMS], on_osm)
    unit.on_connected(listener.declare)
    return listener
