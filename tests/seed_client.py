"""A client written from the seed's text alone (qbroker-amqp-structure.rst), on raw aiormq.

It sets exactly what the seed lists: app-id, message-id, reply-to, correlation-id, content-type, and
the headers ``version`` and ``name``; no AMQP ``type``, no ``deadline``, no ``app``. Anything qbroker
needs beyond that is a dependency on a property the seed does not define, and these tests catch it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiormq
import orjson
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic


def decoded(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: decoded(v) for k, v in value.items()}
    return value


class SeedClient:
    def __init__(self, channel: aiormq.abc.AbstractChannel, me: str, prefix: str = "") -> None:
        self.channel = channel
        self.uuid = me
        self.prefix = prefix
        self.replies: dict[str, asyncio.Future[DeliveredMessage]] = {}
        self.stray: list[DeliveredMessage] = []

    async def _on_reply(self, message: DeliveredMessage) -> None:
        key = message.header.properties.correlation_id
        future = self.replies.get(key or "")
        if future is not None and not future.done():
            future.set_result(message)
        else:
            self.stray.append(message)

    def properties(
        self,
        name: str | None,
        *,
        message_id: str,
        reply_to: str | None,
        headers: dict[str, Any] | None = None,
        **extra: Any,
    ) -> Basic.Properties:
        table = {"version": 1, **({"name": name} if name is not None else {})}
        if headers is not None:
            table = headers
        return Basic.Properties(
            app_id=self.uuid,
            message_id=message_id,
            reply_to=reply_to,
            content_type="application/json",
            headers=table,
            **extra,
        )

    async def request(self, name: str, body: Any, *, reply: bool = True, exchange: str = "rpc", **extra: Any) -> str:
        """Publish a request (or, with exchange="alert", an alert); returns its message-id."""
        message_id = uuid.uuid4().hex
        if reply:
            self.replies[message_id] = asyncio.get_running_loop().create_future()
        await self.channel.basic_publish(
            orjson.dumps(body),
            exchange=self.prefix + exchange,
            routing_key=name,
            properties=self.properties(name, message_id=message_id, reply_to=self.uuid if reply else None, **extra),
        )
        return message_id

    async def reply(self, message_id: str, timeout: float = 60) -> tuple[dict[str, Any], Any]:
        """(headers, body) of the reply to ``message_id``; the ceiling only catches hangs."""
        message = await asyncio.wait_for(self.replies[message_id], timeout)
        headers = decoded(dict(message.header.properties.headers or {}))
        return headers, orjson.loads(message.body) if message.body else None

    async def call(self, name: str, body: Any, **extra: Any) -> tuple[dict[str, Any], Any]:
        return await self.reply(await self.request(name, body, **extra))


@asynccontextmanager
async def seed_client(url: str, prefix: str = "") -> AsyncIterator[SeedClient]:
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        me = uuid.uuid4().hex
        queue = f"{prefix}reply_{me}"
        await channel.queue_declare(queue, exclusive=True, auto_delete=True)
        await channel.queue_bind(queue, prefix + "reply", routing_key=me)
        client = SeedClient(channel, me, prefix)
        await channel.basic_consume(queue, client._on_reply, no_ack=True)
        yield client
    finally:
        await connection.close()
