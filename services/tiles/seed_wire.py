"""The seed's literal wire (toposm-message-protocol.md), named once for every program that speaks it.

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

log = structlog.get_logger("toposm.seed_wire")
OSM_EXCHANGE = "osm"
EXPIRE_TOPIC = "expire_toposm"
ALL_PROGRAMS = "toposm"
QUEUEMASTER_TOPIC = "toposm.queuemaster"
RENDER_ROOT = "toposm.render"
# The app_id of our queuemaster's `queuemaster online` on `osm`: our renderers hear the same announcement
# over qbroker and register there, not twice.
QBROKER_QUEUEMASTER_APP = "toposm.queuemaster"

# A client's reply queue on the seed's wire: one the broker named (``amq.gen-...``, what a client gets by
# declaring ""), or one of the documented client prefix ``toposm.reply.<word>`` (a seed program that wants
# a name of its own). Nothing else: not ``dead``, ``rpc_*``, ``reply_<uuid>``, a renderer's or the
# queuemaster's queue, which an answer published by name would otherwise fill.
CLIENT_REPLY_PREFIX = "toposm.reply."
_CLIENT_REPLY_QUEUE = re.compile(r"amq\.gen-[A-Za-z0-9_-]{1,128}|toposm\.reply\.[A-Za-z0-9_-]{1,128}")


def client_reply_queue(name: str | None) -> bool:
    """Whether ``name`` is shaped like a client's reply queue on the seed's wire (see above)."""
    return name is not None and _CLIENT_REPLY_QUEUE.fullmatch(name) is not None


def render_levels(hostname: str, pid: int) -> tuple[str, ...]:
    """The levels above a process's threads: ``toposm.render``, ``.<host>``, ``.<host>.<pid>``."""
    return (RENDER_ROOT, f"{RENDER_ROOT}.{hostname}", f"{RENDER_ROOT}.{hostname}.{pid}")


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
