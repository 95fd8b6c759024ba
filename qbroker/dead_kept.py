"""The kept copies of dead messages: what ``qbroker dead list/show/replay`` reads.

The collector that takes a dead request from ``dead`` copies it to the ``dead.kept.in`` exchange and the
``dead.kept`` queue (``dead_letter``), with where it was first published and why it died in
``x-qbroker-dead-*`` headers; nobody consumes that queue. Its bounds (``x-max-length`` and
``x-max-length-bytes``, oldest dropped first, and ``x-message-ttl``; ``Config.dead_kept_*``) keep it from growing
without end.

Reading never consumes: messages are fetched with ``basic.get`` without acknowledgement and go back to
the queue, in their order, when the reading channel closes. Replaying one publishes it again on the
``rpc`` exchange with its request name and acknowledges its kept copy. Any account that may collect dead
letters may publish into ``dead.kept.in``, so a kept copy's headers are claims: values are shortened, only
requests (origin: our ``rpc`` exchange) are replayed, and a replay carries no ``user_id`` (the broker
accepts only the operator's own, and an endpoint that checks accounts refuses a request without one):
replaying gives a request no authority its sender lacked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from qbroker.config import Config
from qbroker.dead_letter import KEPT_HEADERS
from qbroker.errors import ConnectionLost, RequestFailed
from qbroker.transport import Connection

_MAX_TEXT = 256
# Headers the broker or the collector added (not part of the message as its sender published it), and the
# caller's deadline, passed already: a replay is a new delivery, which the server is to run.
_ADDED_HEADERS = (
    "deadline",
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    *KEPT_HEADERS,
)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value[:_MAX_TEXT] if isinstance(value, str) else None


@dataclass
class KeptMessage:
    position: int  # 1 = the oldest kept
    message_id: str | None
    kind: str  # rpc, alert, reply or unknown
    reason: str  # unroutable, expired, rejected, maxlen, ...
    exchange: str | None  # where it was first published
    routing_key: str | None
    size: int
    content_type: str | None
    body: bytes = field(repr=False)
    headers: dict[str, Any] = field(repr=False, default_factory=dict)
    raw: AbstractIncomingMessage | None = field(repr=False, default=None)

    def summary(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "message_id": self.message_id,
            "kind": self.kind,
            "reason": self.reason,
            "exchange": self.exchange,
            "name": self.routing_key,
            "size": self.size,
        }

    def describe(self) -> dict[str, Any]:
        body: Any = self.body.decode("utf-8", "replace")
        return {
            **self.summary(),
            "content_type": self.content_type,
            "headers": {str(k): _plain(v) for k, v in self.headers.items()},
            "body": body,
        }


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


class KeptReader:
    """One read of ``dead.kept`` on a channel of its own; ``close()`` puts back whatever was not replayed."""

    def __init__(self, connection: Connection, config: Config) -> None:
        self._connection = cast(AbstractConnection, connection)
        self.config = config
        self._channel: AbstractChannel | None = None

    async def read(self, limit: int) -> list[KeptMessage]:
        """Up to ``limit`` kept messages, oldest first (none consumed)."""
        self._channel = await self._connection.channel(publisher_confirms=True)
        queue = await self._channel.declare_queue(self.config.dead_kept_queue_name, passive=True)
        kept: list[KeptMessage] = []
        while len(kept) < limit:
            message = await queue.get(no_ack=False, fail=False)
            if message is None:
                break
            headers = dict(message.headers) if isinstance(message.headers, Mapping) else {}
            kind, reason, exchange, routing_key = (_text(headers.get(h)) for h in KEPT_HEADERS)
            kept.append(
                KeptMessage(
                    position=len(kept) + 1,
                    message_id=_text(message.message_id),
                    kind=kind or "unknown",
                    reason=reason or "unknown",
                    exchange=exchange,
                    routing_key=routing_key,
                    size=len(message.body),
                    content_type=_text(message.content_type),
                    body=message.body,
                    headers=headers,
                    raw=message,
                )
            )
        return kept

    async def replay(self, message: KeptMessage) -> None:
        """Publish ``message`` again where it was first published, then drop its kept copy."""
        if self._channel is None or message.raw is None:
            raise ConnectionLost("not reading the kept queue")
        if message.exchange != self.config.exchange_name("rpc") or not message.routing_key:
            raise RequestFailed("not_replayable", "only requests are replayed", detail=message.message_id)
        raw = message.raw
        headers = {k: v for k, v in message.headers.items() if k not in _ADDED_HEADERS}
        exchange = await self._channel.get_exchange(message.exchange, ensure=False)
        # No expiration (it expired once already) and no user_id (the broker accepts only our own).
        await exchange.publish(
            aio_pika.Message(
                message.body,
                headers=headers,
                content_type=raw.content_type,
                content_encoding=raw.content_encoding,
                message_id=raw.message_id,
                correlation_id=raw.correlation_id,
                reply_to=raw.reply_to,
                app_id=raw.app_id,
                type=raw.type,
                priority=raw.priority,
            ),
            routing_key=message.routing_key,
        )
        await raw.ack()

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()  # unacknowledged messages go back to the queue, in order
