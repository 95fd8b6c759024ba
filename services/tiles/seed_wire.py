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

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aiormq.exceptions import ChannelPreconditionFailed

from .contract import CLIENT_REPLY_PREFIX, OSM_EXCHANGE

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


async def declare_osm_exchange(connection: AbstractConnection) -> tuple[AbstractChannel, AbstractExchange]:
    """A channel and the ``osm`` topic exchange (durable, as we declare it; as it is, if a seed program
    declared it first with other flags)."""
    channel = await connection.channel()
    try:
        exchange = await channel.declare_exchange(OSM_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    except ChannelPreconditionFailed:
        # The failed declare closed the channel, so open another and only check the exchange exists.
        log.warning("osm exchange exists with other flags; using it as declared")
        channel = await connection.channel()
        exchange = await channel.get_exchange(OSM_EXCHANGE, ensure=True)
    return channel, exchange
