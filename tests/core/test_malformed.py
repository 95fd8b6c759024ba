"""Malformed messages from foreign clients are answered `fail`, and the unit keeps serving."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import orjson
import pytest

from tests.conftest import MakeUnit

# A raw aio-pika client speaks to the broker directly: RabbitMQ only.
pytestmark = pytest.mark.rabbitmq_only


class RawClient:
    """A bare aio-pika client that speaks (or mangles) the wire format by hand."""

    def __init__(self, connection: aio_pika.abc.AbstractConnection, channel: aio_pika.abc.AbstractChannel,
                 replies: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage], uuid_: str) -> None:
        self.connection = connection
        self.channel = channel
        self.replies = replies
        self.uuid = uuid_

    async def send(self, name: str, body: bytes, *, headers: dict[str, Any] | None = None,
                   content_type: str = "application/json", reply_to: str | None = "",
                   message_id: str | None = "auto") -> str | None:
        message_id = uuid.uuid4().hex if message_id == "auto" else message_id
        exchange = await self.channel.get_exchange("rpc")
        await exchange.publish(
            aio_pika.Message(body, headers=headers if headers is not None else {"version": 1, "name": name},
                             content_type=content_type, message_id=message_id,
                             reply_to=self.uuid if reply_to == "" else reply_to, type="rpc"),
            routing_key=name,
        )
        return message_id

    async def reply(self, message_id: str | None, timeout: float = 5) -> tuple[dict[str, Any], Any]:
        while True:
            message = await asyncio.wait_for(self.replies.get(), timeout)
            if message.correlation_id == message_id:
                body = orjson.loads(message.body) if message.body else None
                return dict(message.headers or {}), body


@pytest.fixture
async def raw_client(amqp_url: str) -> AsyncIterator[RawClient]:
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    me = uuid.uuid4().hex
    queue = await channel.declare_queue(f"reply_{me}", exclusive=True, auto_delete=True)
    reply = await channel.declare_exchange("reply", aio_pika.ExchangeType.DIRECT, durable=True)
    await queue.bind(reply, routing_key=me)
    replies: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
    await queue.consume(replies.put, no_ack=True)
    yield RawClient(connection, channel, replies, me)
    await connection.close()


def _error(headers: dict[str, Any]) -> dict[str, Any]:
    error = headers["error"]
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in error.items()}


@pytest.mark.parametrize(
    ("case", "expected_id", "expected_text"),
    [
        ("bad_json", "bad_body", "not valid JSON"),
        ("wrong_version", "bad_version", "unsupported protocol version 2"),
        ("missing_version", "bad_header", "version"),
        ("missing_name", "bad_header", "name"),
        ("huge_body", "too_large", "exceeds the limit"),
        ("pickle", "bad_body", "not accepted"),
    ],
)
async def test_malformed_request_answered_fail(make_unit: MakeUnit, raw_client: RawClient, case: str,
                                               expected_id: str, expected_text: str) -> None:
    server = await make_unit("test.server", max_body_bytes=64 * 1024)

    @server.rpc("t.strict")
    async def strict(n: int) -> int:
        return n + 1

    await server.start()
    body, headers, ctype = b'{"n": 1}', {"version": 1, "name": "t.strict"}, "application/json"
    message_id = uuid.uuid4().hex
    if case == "bad_json":
        body = b'{"n": 1'
    elif case == "wrong_version":
        headers["version"] = 2
    elif case == "missing_version":
        del headers["version"]
    elif case == "missing_name":
        del headers["name"]
    elif case == "huge_body":
        body = orjson.dumps({"n": 1, "pad": "x" * 200_000})
    elif case == "pickle":
        body, ctype = b"\x80\x04\x95", "application/x-python-pickle"
    await raw_client.send("t.strict", body, headers=headers, content_type=ctype, message_id=message_id)
    reply_headers, _ = await raw_client.reply(message_id)
    error = _error(reply_headers)
    assert error["status"] == "fail"
    assert error["id"] == expected_id
    # The seed: one message per (status, id, part); what was wrong with this message is in `detail`.
    assert error["message"] == f"the message is malformed ({expected_id})"
    assert expected_text in error.get("detail", "")
    # ... and the unit still serves well-formed requests.
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.strict", {"n": 41}) == 42


async def test_request_without_reply_to_is_dropped_quietly(make_unit: MakeUnit, raw_client: RawClient) -> None:
    server = await make_unit("test.server")
    calls: list[int] = []

    @server.rpc("t.noreply")
    async def noreply(n: int) -> int:
        calls.append(n)
        return n

    await server.start()
    await raw_client.send("t.noreply", b'{"n": 7}', reply_to=None)
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.noreply", {"n": 8}) == 8
    assert calls == [7, 8]
