"""A neutral record of one delivery, whether it came from our own queues or RabbitMQ's firehose."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

Source = Literal["traffic", "dead", "firehose"]


def text(value: Any) -> Any:
    """AMQP tables give bytes for long strings; we want str."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else value


@dataclass
class Captured:
    source: Source
    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    app_id: str | None = None
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    content_type: str | None = None
    type: str | None = None
    seen_at: float = field(default_factory=time.time)


def from_delivery(message: Any, source: Source) -> Captured:
    """An aio-pika IncomingMessage from one of our own queues."""
    return Captured(
        source=source,
        exchange=message.exchange or "",
        routing_key=message.routing_key or "",
        body=bytes(message.body),
        headers=dict(message.headers or {}),
        app_id=message.app_id,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        content_type=message.content_type,
        type=message.type,
    )


def from_trace(message: Any) -> Captured | None:
    """A message from ``amq.rabbitmq.trace`` (firehose): the original is described in its headers.

    Only ``publish.<exchange>`` traces are used: each message is shown once, when it was published.
    """
    headers = message.headers or {}
    routing = message.routing_key or ""
    if not routing.startswith("publish."):
        return None
    props = headers.get("properties") or {}
    keys = headers.get("routing_keys") or []
    return Captured(
        source="firehose",
        exchange=text(headers.get("exchange_name")) or routing.removeprefix("publish."),
        routing_key=text(keys[0]) if keys else "",
        body=bytes(message.body),
        headers=dict(props.get("headers") or {}),
        app_id=text(props.get("app_id")),
        message_id=text(props.get("message_id")),
        correlation_id=text(props.get("correlation_id")),
        reply_to=text(props.get("reply_to")),
        content_type=text(props.get("content_type")),
        type=text(props.get("type")),
    )
