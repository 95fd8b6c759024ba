"""A client written to the seed alone (no AMQP ``type``, ``deadline`` or ``app``) gets every answer."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import MakeUnit
from tests.qbroker.core.waits import until_ready_messages
from tests.seed_client import seed_client

pytestmark = pytest.mark.rabbitmq_only


async def test_request_to_nobody_is_answered_no_server(make_unit: MakeUnit, amqp_url: str) -> None:
    collector = await make_unit("test.collector")  # dead_letters=True by default
    await collector.start()
    async with seed_client(amqp_url) as client:
        headers, body = await client.call("t.nobody.serves.this", {"x": 1})
    assert headers["error"]["status"] == "fail"
    assert headers["error"]["id"] == "no_server"
    # The name is in the message, or in `detail` where the message is fixed per error id.
    assert "t.nobody.serves.this" in headers["error"]["message"] + headers["error"].get("detail", "")
    assert collector.dead_letters is not None
    assert collector.dead_letters.stats().get("rpc.unroutable") == 1


async def test_request_served_and_answered(make_unit: MakeUnit, amqp_url: str) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.seed.add")
    async def add(a: int, b: int) -> int:
        return a + b

    await server.start()
    async with seed_client(amqp_url) as client:
        headers, body = await client.call("t.seed.add", {"a": 2, "b": 3})
    assert body == 5
    assert "error" not in headers
    assert headers["version"] == 1


async def test_request_expired_in_queue_is_answered_queue_timeout(make_unit: MakeUnit, amqp_url: str) -> None:
    """Dead-lettered by the broker (x-death names the rpc exchange): answered although no ``type``."""
    server = await make_unit("test.server")
    gate = asyncio.Event()

    @server.rpc("t.seed.slow", prefetch=1)
    async def slow() -> str:
        await gate.wait()
        return "done"

    await server.start()
    async with seed_client(amqp_url) as client:
        first = await client.request("t.seed.slow", {})
        await until_ready_messages(server, "rpc_t.seed.slow", 0)  # the first is in the handler
        # The second waits behind it, its AMQP expiration passes, the broker dead-letters it.
        second = await client.request("t.seed.slow", {}, expiration="50")
        headers, _ = await client.reply(second)
        gate.set()
        first_headers, first_body = await client.reply(first)
    assert headers["error"]["id"] == "queue_timeout"
    assert first_body == "done"


async def test_alert_with_reply_to_is_answered(make_unit: MakeUnit, amqp_url: str) -> None:
    listener = await make_unit("test.listener")

    @listener.on_alert("t.seed.hello")
    async def hello(who: str) -> str:
        return f"hello {who}"

    await listener.start()
    async with seed_client(amqp_url) as client:
        headers, body = await client.call("t.seed.hello", {"who": "seed"}, exchange="alert")
    assert body == "hello seed"


async def test_reply_from_a_seed_server_is_read(make_unit: MakeUnit, amqp_url: str) -> None:
    """A server written to the seed: correlation-id, content-type, headers version; nothing else."""
    caller = await make_unit("test.caller")
    await caller.start()
    async with seed_client(amqp_url) as server:
        queue = "rpc_t.seed.echo"
        await server.channel.queue_declare(queue, auto_delete=True)
        await server.channel.queue_bind(queue, "rpc", routing_key="t.seed.echo")

        async def answer(message) -> None:  # type: ignore[no-untyped-def]
            props = message.header.properties
            from pamqp.commands import Basic

            await server.channel.basic_publish(
                message.body,
                exchange="reply",
                routing_key=props.reply_to,
                properties=Basic.Properties(
                    correlation_id=props.message_id,
                    content_type="application/json",
                    app_id=server.uuid,
                    message_id="r-" + props.message_id,
                    headers={"version": 1},
                ),
            )
            await message.channel.basic_ack(message.delivery_tag)

        await server.channel.basic_consume(queue, answer)
        assert await caller.call("t.seed.echo", {"k": [1, 2]}) == {"k": [1, 2]}
