"""Messages inside the in-memory broker: what a publish stores, and what a consumer receives.

A published ``aio_pika.Message`` is copied into a ``StoredMessage`` the way the wire would copy it (its
header table goes through pamqp's encoder and decoder), so a test cannot pass only because publisher
and consumer share a mutable object or because a header value would not survive the wire.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aio_pika.abc import AbstractMessage
from aio_pika.exceptions import ChannelInvalidStateError, MessageProcessError
from aio_pika.message import encode_expiration, encode_timestamp
from pamqp import decode, encode


def wire_table(headers: dict[str, Any]) -> dict[str, Any]:
    """A header table as it comes back from RabbitMQ: encoded and decoded by pamqp, as aiormq does.

    So the wire's quirks show up in memory too: floats travel as 32-bit floats, datetimes lose their
    sub-second part, and values AMQP tables cannot carry (bytes, tuples, sets) fail the publish with
    the same ``TypeError`` aiormq raises.
    """
    _, table = decode.field_table(encode.field_table(headers))
    return table


@dataclass(frozen=True)
class StoredMessage:
    """One published message: body, AMQP properties, and where it was published."""

    body: bytes
    exchange: str
    routing_key: str
    headers: dict[str, Any] = field(default_factory=dict)
    content_type: str | None = None
    content_encoding: str | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration_ms: int | None = None
    message_id: str | None = None
    timestamp: datetime.datetime | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None

    @classmethod
    def from_published(cls, message: AbstractMessage, exchange: str, routing_key: str) -> StoredMessage:
        expiration = encode_expiration(message.expiration)
        return cls(
            body=bytes(message.body),
            exchange=exchange,
            routing_key=routing_key,
            headers=wire_table(dict(message.headers or {})),
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=int(message.delivery_mode) if message.delivery_mode is not None else None,
            priority=message.priority,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            expiration_ms=max(0, int(expiration)) if expiration is not None else None,
            message_id=message.message_id,
            timestamp=encode_timestamp(message.timestamp) if message.timestamp is not None else None,
            type=message.type,
            user_id=message.user_id,
            app_id=message.app_id,
        )

    @property
    def persistent(self) -> bool:
        return self.delivery_mode == 2

    def dead_lettered(self, *, reason: str, queue: str, dead_letter_routing_key: str | None) -> StoredMessage:
        """The copy RabbitMQ republishes to a dead-letter exchange, with its ``x-death`` history."""
        headers = copy.deepcopy(self.headers)
        deaths: list[dict[str, Any]] = list(headers.get("x-death") or [])
        existing = next((d for d in deaths if d.get("queue") == queue and d.get("reason") == reason), None)
        if existing is not None:
            # RabbitMQ keeps one entry per (queue, reason), counts repeats and moves it to the front.
            deaths.remove(existing)
            existing["count"] = int(existing.get("count", 1)) + 1
            existing["time"] = _now()
            entry = existing
        else:
            entry = {
                "count": 1,
                "reason": reason,
                "queue": queue,
                "time": _now(),
                "exchange": self.exchange,
                "routing-keys": [self.routing_key],
            }
            if self.expiration_ms is not None:
                entry["original-expiration"] = str(self.expiration_ms)
        headers["x-death"] = [entry, *deaths]
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", queue)
        headers.setdefault("x-first-death-exchange", self.exchange)
        # The per-message expiration is removed, or the message would expire again in the next queue.
        return replace(
            self, headers=headers, expiration_ms=None, routing_key=dead_letter_routing_key or self.routing_key
        )


def _now() -> datetime.datetime:
    # AMQP timestamps have one-second resolution.
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


Settle = Callable[["DeliveredMessage", str, bool], None]


class DeliveredMessage:
    """What a consumer callback receives: the attributes of ``AbstractIncomingMessage`` qbroker reads,
    plus ``ack()`` / ``nack(requeue=)`` / ``reject(requeue=)`` with aio-pika's error behaviour."""

    def __init__(
        self,
        stored: StoredMessage,
        *,
        delivery_tag: int,
        consumer_tag: str,
        redelivered: bool,
        no_ack: bool,
        settle: Settle,
        channel_open: Callable[[], bool],
    ) -> None:
        self.body = stored.body
        self.headers: dict[str, Any] = copy.deepcopy(stored.headers)
        self.content_type = stored.content_type
        self.content_encoding = stored.content_encoding
        self.delivery_mode = stored.delivery_mode
        self.priority = stored.priority
        self.correlation_id = stored.correlation_id
        self.reply_to = stored.reply_to
        self.expiration = stored.expiration_ms / 1000 if stored.expiration_ms is not None else None
        self.message_id = stored.message_id
        self.timestamp = stored.timestamp
        self.type = stored.type
        self.user_id = stored.user_id
        self.app_id = stored.app_id
        self.exchange = stored.exchange
        self.routing_key = stored.routing_key
        self.delivery_tag = delivery_tag
        self.consumer_tag = consumer_tag
        self.redelivered = redelivered
        self._no_ack = no_ack
        self._processed = no_ack
        self._settle = settle
        self._channel_open = channel_open

    @property
    def processed(self) -> bool:
        return self._processed

    def _check_settleable(self) -> None:
        if self._no_ack:
            raise TypeError('Can\'t ack message with "no_ack" flag')
        if self._processed:
            raise MessageProcessError("Message already processed", self)
        if not self._channel_open():
            raise ChannelInvalidStateError("the channel this message was delivered on is closed")

    async def ack(self) -> None:
        self._check_settleable()
        self._processed = True
        self._settle(self, "ack", False)

    async def reject(self, requeue: bool = False) -> None:
        self._check_settleable()
        self._processed = True
        self._settle(self, "reject", requeue)

    async def nack(self, requeue: bool = True) -> None:
        self._check_settleable()
        self._processed = True
        self._settle(self, "reject", requeue)

    def __repr__(self) -> str:
        return (
            f"<DeliveredMessage exchange={self.exchange!r} routing_key={self.routing_key!r} "
            f"message_id={self.message_id!r} tag={self.delivery_tag}>"
        )
