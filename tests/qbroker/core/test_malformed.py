"""Malformed messages from foreign clients are answered `fail`, and the unit keeps serving."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import orjson
import pytest

from qbroker.errors import ErrorInfo
from qbroker.metrics import instrument
from qbroker.middleware import Middleware
from tests.conftest import MakeUnit

# A raw aio-pika client speaks to the broker directly: RabbitMQ only.
pytestmark = pytest.mark.rabbitmq_only


class RawClient:
    """A bare aio-pika client that speaks (or mangles) the wire format by hand."""

    def __init__(
        self,
        connection: aio_pika.abc.AbstractConnection,
        channel: aio_pika.abc.AbstractChannel,
        replies: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage],
        uuid_: str,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.replies = replies
        self.uuid = uuid_

    async def send(
        self,
        name: str,
        body: bytes,
        *,
        headers: dict[str, Any] | None = None,
        content_type: str = "application/json",
        reply_to: str | None = "",
        message_id: str | None = "auto",
    ) -> str | None:
        message_id = uuid.uuid4().hex if message_id == "auto" else message_id
        exchange = await self.channel.get_exchange("rpc")
        await exchange.publish(
            aio_pika.Message(
                body,
                headers=headers if headers is not None else {"version": 1, "name": name},
                content_type=content_type,
                message_id=message_id,
                reply_to=self.uuid if reply_to == "" else reply_to,
                type="rpc",
            ),
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


class _BrokenAudit(Middleware):
    """A refusal hook whose sink is down: logged, and the message is answered all the same."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str]] = []

    def refused(self, name: str, kind: str, error: ErrorInfo) -> None:
        self.told.append((name, kind, error.id))
        raise RuntimeError("audit sink down")


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
async def test_malformed_request_answered_fail(
    make_unit: MakeUnit, raw_client: RawClient, case: str, expected_id: str, expected_text: str
) -> None:
    server = await make_unit("test.server", max_body_bytes=64 * 1024)
    audit = _BrokenAudit()
    server.use(audit)
    metrics = instrument(server)

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
    # Never handled, but counted and told to the middlewares (a broken hook does not cost the reply).
    assert audit.told == [("t.strict", "rpc", expected_id)]
    assert metrics.handled.values == {("t.strict", "rpc", "fail"): 1}
    assert metrics.handler_errors.values == {("t.strict", "rpc", "fail"): 1}
    assert metrics.errors.values == {("handler", expected_id): 1}
    # ... and the unit still serves well-formed requests.
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.strict", {"n": 41}) == 42
    assert metrics.handled.values[("t.strict", "rpc", "ok")] == 1


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


async def test_a_malformed_alert_is_counted_and_told_to_the_middlewares(
    make_unit: MakeUnit, raw_client: RawClient
) -> None:
    server = await make_unit("test.server")
    audit = _BrokenAudit()
    server.use(audit)
    metrics = instrument(server)
    heard: list[Any] = []

    @server.on_alert("t.event")
    async def event(n: int) -> None:
        heard.append(n)

    await server.start()
    alert = await raw_client.channel.get_exchange("alert")
    message_id = uuid.uuid4().hex
    await alert.publish(
        aio_pika.Message(
            b'{"n": 1',
            headers={"version": 1, "name": "t.event"},
            content_type="application/json",
            message_id=message_id,
            reply_to=raw_client.uuid,
            type="alert",
        ),
        routing_key="t.event",
    )
    headers, _ = await raw_client.reply(message_id)
    assert _error(headers)["id"] == "bad_body"
    assert audit.told == [("t.event", "alert", "bad_body")] and heard == []
    assert metrics.handled.values == {("t.event", "alert", "fail"): 1}
    assert metrics.errors.values == {("handler", "bad_body"): 1}
