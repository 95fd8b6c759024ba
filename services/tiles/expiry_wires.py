"""Expirations on both wires: qbroker's ``alert`` exchange and the seed's ``osm``, once per wire, no echoes.

* A producer of ours (the Spark bridge, the queuemaster's ``expire`` command) publishes each expiry list
  once on each wire, with one message id carrying ``BOTH_WIRES_PREFIX`` on both.
* A producer that speaks one wire only (a seed program on ``osm``, ``qbroker alert expire_toposm``) leaves
  the other wire to the queuemaster's relay: a list heard without the prefix is published once on the
  other wire, marked, with the id ``BOTH_WIRES_PREFIX + expiry_key``. A marked list is never relayed, so
  nothing goes back and forth.
* A consumer listens on both wires and takes each list once: the copy on the second wire has the same
  ``expiry_key`` as the first (``TwinFilter``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Literal, cast

import aio_pika
import structlog
from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage

from qbroker import ConnectionLost, Unit
from qbroker.transport import Connection

from .contract import EXPIRE_TOPIC, join_expiry_list
from .seed_wire import declare_osm_exchange

log = structlog.get_logger("toposm.expiry_wires")
BOTH_WIRES_PREFIX = "toposm-both."
Wire = Literal["alert", "osm"]


def expiry_key(message_id: str | None, text: str) -> str:
    """What names one expiry list on either wire: its message id without the mark, else its text's hash
    (a seed program need not set a message id)."""
    if message_id:
        return message_id.removeprefix(BOTH_WIRES_PREFIX)
    return "sha1-" + hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def on_both_wires(message_id: str | None) -> bool:
    return bool(message_id) and message_id.startswith(BOTH_WIRES_PREFIX)  # type: ignore[union-attr]


def expiry_text(body: object) -> str | None:
    """An expiry body as text (``z/x/y;...``; bytes decoded, a JSON list joined), or None."""
    if isinstance(body, bytes | bytearray):
        return bytes(body).decode("utf-8", "replace")
    if isinstance(body, list):
        return join_expiry_list(body)
    return body if isinstance(body, str) else None


class TwinFilter:
    """Takes each expiry list once though it arrives on both wires: a key seen last on the *other* wire is
    that list's twin (dropped); seen on the same wire, it is a new list with the same text (taken).
    Bounded: the oldest keys are forgotten first."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: OrderedDict[str, Wire] = OrderedDict()
        self._size = size
        self.twins = 0

    def first(self, key: str, wire: Wire) -> bool:
        if self._seen.get(key, wire) != wire:
            del self._seen[key]
            self.twins += 1
            return False
        self._seen[key] = wire
        self._seen.move_to_end(key)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return True


class OsmPublisher:
    """Publishing on ``osm`` from a qbroker unit: ``unit.on_connected(publisher.declare)``."""

    def __init__(self) -> None:
        self._exchange: AbstractExchange | None = None

    async def declare(self, transport_connection: Connection) -> None:
        _, self._exchange = await declare_osm_exchange(cast(AbstractConnection, transport_connection))

    async def publish(self, routing_key: str, body: bytes, *, message_id: str,
                      content_type: str = "text/plain") -> None:
        if self._exchange is None:
            raise ConnectionLost("the osm exchange is not declared (not connected)")
        await self._exchange.publish(aio_pika.Message(body, content_type=content_type, message_id=message_id),
                                     routing_key=routing_key)


async def publish_expiry(unit: Unit, osm: OsmPublisher, text: str) -> None:
    """One expiry list on both wires, with one marked message id."""
    message_id = BOTH_WIRES_PREFIX + uuid.uuid4().hex
    await unit.alert(EXPIRE_TOPIC, text, content_type="text/plain", message_id=message_id)
    await osm.publish(EXPIRE_TOPIC, text.encode("utf-8"), message_id=message_id)


async def relay_expiry(unit: Unit, osm: OsmPublisher, text: str, message_id: str | None, heard_on: Wire) -> None:
    """A list its producer published on one wire only, published on the other (marked: never relayed back)."""
    if on_both_wires(message_id):
        return
    relayed = BOTH_WIRES_PREFIX + expiry_key(message_id, text)
    if heard_on == "alert":
        await osm.publish(EXPIRE_TOPIC, text.encode("utf-8"), message_id=relayed)
    else:
        await unit.alert(EXPIRE_TOPIC, text, content_type="text/plain", message_id=relayed)


class OsmExpiryListener:
    """Hearing ``expire_toposm`` on ``osm`` from a qbroker unit, as a seed program would: a server-named
    exclusive queue (gone with the connection) bound to that key only. ``unit.on_connected(listener.declare)``;
    every message is acked, whatever ``handle`` does with it."""

    def __init__(self, handle: Callable[[bytes, str | None], Awaitable[None]]) -> None:
        self._handle = handle

    async def declare(self, transport_connection: Connection) -> None:
        channel, exchange = await declare_osm_exchange(cast(AbstractConnection, transport_connection))
        await channel.set_qos(prefetch_count=64)
        queue = await channel.declare_queue("", exclusive=True)
        await queue.bind(exchange, routing_key=EXPIRE_TOPIC)
        await queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            await self._handle(message.body, message.message_id)
        except Exception:  # one bad list must not stop the consumer
            log.exception("expiry from osm failed")
        finally:
            await message.ack()
