"""A request redelivered after its server died is re-published by the next server (qbroker.rpc): the copy
must still name the original sender's account, and nobody else may claim to be forwarding one."""

from __future__ import annotations

import asyncio

import aio_pika
import orjson

from harness import HANG
from qbroker import RequestContext
from qbroker.bus import SENDER_HEADER
from qbroker.request_middleware import FAILURES
from tests.qbroker.security.test_broker_permissions import raw


async def test_redelivered_request_keeps_its_senders_account(provisioned, as_role) -> None:
    entered = asyncio.Event()
    never = asyncio.Event()
    seen: asyncio.Queue[tuple[str | None, object]] = asyncio.Queue()
    first = await as_role("spark_bridge", app="spark.bridge.first", start=False)

    @first.rpc("spark.job")
    async def hang(ctx: RequestContext) -> None:
        entered.set()
        await never.wait()  # dies holding the request, unacknowledged

    await first.start()
    client = await as_role("client")
    call = asyncio.create_task(client.call("spark.job", {}, timeout=HANG))
    await asyncio.wait_for(entered.wait(), HANG)
    second = await as_role("spark_bridge", app="spark.bridge.second", start=False)

    @second.rpc("spark.job")
    async def answer(ctx: RequestContext) -> str | None:
        await seen.put((ctx.user_id, ctx.headers.get(FAILURES)))
        return ctx.user_id

    await second.start()
    await first.kill()  # the broker redelivers to `second`, which re-publishes it with its failure count
    assert await asyncio.wait_for(call, HANG) == provisioned.names["client"]
    # it was the re-published copy (it carries the failure count), made under the bridge's own account
    assert seen.get_nowait() == (provisioned.names["client"], 1)


async def test_a_forwarded_sender_header_from_anyone_else_is_ignored(provisioned, as_role) -> None:
    server = await as_role("spark_bridge", app="spark.bridge.server", start=False)
    seen: asyncio.Queue[str | None] = asyncio.Queue()

    @server.rpc("spark.stats")
    async def stats(ctx: RequestContext) -> None:
        await seen.put(ctx.user_id)

    await server.start()
    async with raw(provisioned, "client") as connection:
        channel = await connection.channel()
        rpc = await channel.get_exchange("rpc", ensure=False)
        for user_id in (provisioned.names["client"], None):
            await rpc.publish(
                aio_pika.Message(
                    orjson.dumps({}),
                    content_type="application/json",
                    message_id=f"m-{user_id}",
                    user_id=user_id,
                    headers={"version": 1, "name": "spark.stats", SENDER_HEADER: provisioned.names["operator"]},
                ),
                routing_key="spark.stats",
            )
            # the claim to forward the operator's request is not believed: it is not the server's account
            assert await asyncio.wait_for(seen.get(), HANG) == user_id
