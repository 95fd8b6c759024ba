"""Expirations on both wires: qbroker's ``alert`` exchange and TopOSM's ``osm``, once per wire, no echoes.

* A producer of ours (the Spark bridge, ``toposm-replicate --postgis`` alone, the queuemaster's ``expire``
  command) publishes each expiry list once on each wire (``publish_expiry``; ``ExpirationBatcher`` cuts long
  lists to the size caps), with one message id carrying ``BOTH_WIRES_PREFIX`` on both; a producer that listens
  too (the queuemaster) takes neither copy back (``TwinFilter.mine``).
* A producer that speaks one wire only (a program on ``osm`` alone, ``qbroker alert expire_toposm``) leaves
  the other wire to the queuemaster's relay: a list heard without the prefix is published once on the
  other wire, marked, with the id ``BOTH_WIRES_PREFIX + expiry_key``. A marked list is never relayed, so
  nothing goes back and forth.
* A consumer listens on both wires and takes each list once: the copy on the second wire has the same
  ``expiry_key`` as the first (``TwinFilter``).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal, cast

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractExchange

from qbroker import ConnectionLost, Unit
from qbroker.transport import Connection

from .contract import EXPIRE_TOPIC, EXPIRY_SEPARATOR, join_expiry_list
from .seed_wire import declare_osm_exchange

BOTH_WIRES_PREFIX = "toposm-both."
Wire = Literal["alert", "osm"]


def expiry_key(message_id: str | None, text: str) -> str:
    """What names one expiry list on either wire: its message id without the mark, else its text's hash
    (the TopOSM protocol asks for no message id)."""
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
    that list's twin (dropped); seen on the same wire, it is a new list with the same text (taken). A list
    we published ourselves (``mine``) is taken on neither. Bounded: the oldest keys are forgotten first."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: OrderedDict[str, tuple[Wire | None, bool]] = OrderedDict()  # key: (last wire, mine)
        self._size = size
        self.twins = 0  # copies dropped as the twin of a list taken on the other wire

    def first(self, key: str, wire: Wire) -> bool:
        last, mine = self._seen.get(key, (None, False))
        if mine:  # our own list back: its first copy is remembered, its twin forgets it
            if last is None:
                self._seen[key] = (wire, True)
            else:
                del self._seen[key]
            return False
        if last is not None and last != wire:
            del self._seen[key]
            self.twins += 1
            return False
        self._remember(key, wire, mine=False)
        return True

    def mine(self, key: str) -> None:
        """A list we publish ourselves (``publish_expiry``): neither copy is taken when it comes back."""
        self._remember(key, None, mine=True)

    def _remember(self, key: str, wire: Wire | None, *, mine: bool) -> None:
        self._seen[key] = (wire, mine)
        self._seen.move_to_end(key)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)


class OsmPublisher:
    """Publishing on ``osm`` from a qbroker unit: ``unit.on_connected(publisher.declare)``."""

    def __init__(self) -> None:
        self._exchange: AbstractExchange | None = None

    async def declare(self, transport_connection: Connection) -> None:
        _, self._exchange = await declare_osm_exchange(cast(AbstractConnection, transport_connection))

    async def publish(
        self, routing_key: str, body: bytes, *, message_id: str, content_type: str = "text/plain"
    ) -> None:
        if self._exchange is None:
            raise ConnectionLost("the osm exchange is not declared (not connected)")
        await self._exchange.publish(
            aio_pika.Message(body, content_type=content_type, message_id=message_id), routing_key=routing_key
        )


class ExpirationBatcher:
    """Joins tile names into expiry lists and hands a batch to ``send`` before it exceeds either cap (the Spark
    bridge's jobs and ``toposm-replicate --postgis`` without an embedded store both publish through it)."""

    def __init__(self, send: Callable[[str], None], *, max_bytes: int = 65_536, max_tiles: int = 2_000) -> None:
        if max_bytes < 32 or max_tiles < 1:
            raise ValueError("batch caps too small: max_bytes >= 32 and max_tiles >= 1")
        self._send = send
        self._max_bytes = max_bytes
        self._max_tiles = max_tiles
        self._pending: list[str] = []
        self._pending_bytes = 0
        self.messages_sent = 0
        self.tiles_sent = 0

    def add(self, tile: str) -> None:
        size = len(tile) + (len(EXPIRY_SEPARATOR) if self._pending else 0)  # names are ASCII: len == bytes
        if self._pending and (self._pending_bytes + size > self._max_bytes or len(self._pending) >= self._max_tiles):
            self.flush()
            size = len(tile)
        self._pending.append(tile)
        self._pending_bytes += size

    def flush(self) -> None:
        if not self._pending:
            return
        self._send(join_expiry_list(self._pending))
        self.messages_sent += 1
        self.tiles_sent += len(self._pending)
        self._pending = []
        self._pending_bytes = 0


def new_expiry_key() -> str:
    return uuid.uuid4().hex


async def publish_expiry(unit: Unit, osm: OsmPublisher, text: str, key: str | None = None) -> None:
    """One expiry list on both wires, with one marked message id (``BOTH_WIRES_PREFIX + key``; a producer
    that also listens passes the ``key`` it told its ``TwinFilter.mine`` first)."""
    message_id = BOTH_WIRES_PREFIX + (key or new_expiry_key())
    # Both at once: each waits for its broker confirm, and one after the other the two round trips added
    # up (docs/performance.md, "Index boxes on a 64 m grid, and the two wires at once"). Either failing fails the call
    # as before; the list may then be out on the other wire (a tile expired again is only rendered again).
    await asyncio.gather(
        unit.alert(EXPIRE_TOPIC, text, content_type="text/plain", message_id=message_id),
        osm.publish(EXPIRE_TOPIC, text.encode("utf-8"), message_id=message_id),
    )


async def relay_expiry(unit: Unit, osm: OsmPublisher, text: str, message_id: str | None, heard_on: Wire) -> None:
    """A list its producer published on one wire only, published on the other (marked: never relayed back)."""
    if on_both_wires(message_id):
        return
    relayed = BOTH_WIRES_PREFIX + expiry_key(message_id, text)
    if heard_on == "alert":
        await osm.publish(EXPIRE_TOPIC, text.encode("utf-8"), message_id=relayed)
    else:
        await unit.alert(EXPIRE_TOPIC, text, content_type="text/plain", message_id=relayed)
