"""A reply or request that cannot be published fails alone: the caller gets an error, other calls go on."""

from __future__ import annotations

import asyncio

import pytest

from qbroker import BadMessage, ReplyTooLarge, RequestContext, RequestFailed, Unit
from tests.conftest import MakeUnit

LIMIT = 64 * 1024


async def _call_in_flight(make_unit: MakeUnit, server: Unit) -> tuple[Unit, asyncio.Future[str], asyncio.Event]:
    """``server`` gets a ``t.gated`` endpoint that answers once ``gate`` is set; a started client has one
    call to it in flight (its handler running). Returns (client, the call, gate)."""
    gate, started = asyncio.Event(), asyncio.Event()

    @server.rpc("t.gated")
    async def gated() -> str:
        started.set()
        await gate.wait()
        return "still here"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    in_flight = asyncio.ensure_future(client.call("t.gated", timeout=60))
    await asyncio.wait_for(started.wait(), 60)
    return client, in_flight, gate


async def test_oversized_reply_answers_reply_too_large_and_spares_other_calls(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server", max_body_bytes=LIMIT)

    @server.rpc("t.big")
    async def big(n: int) -> str:
        return "x" * n

    client, in_flight, gate = await _call_in_flight(make_unit, server)
    with pytest.raises(ReplyTooLarge, match="exceeds the limit"):
        await client.call("t.big", {"n": 2 * LIMIT}, timeout=60)
    gate.set()
    assert await in_flight == "still here"  # the call in flight on the same connection survived
    assert await client.call("t.big", {"n": 10}) == "x" * 10


async def test_oversized_request_is_refused_before_it_leaves(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.echo")
    async def echo(text: str) -> str:
        return text

    await server.start()
    client = await make_unit("test.client", max_body_bytes=LIMIT)
    await client.start()
    with pytest.raises(BadMessage, match="exceeds the limit"):
        await client.call("t.echo", {"text": "y" * (2 * LIMIT)}, timeout=60)
    assert await client.call("t.echo", {"text": "ok"}) == "ok"


@pytest.mark.rabbitmq_only
async def test_publish_the_broker_refuses_fails_alone(make_unit: MakeUnit) -> None:
    """RabbitMQ closes the publishing channel on a refused publish (here a user-id that is not ours):
    the bus reopens that channel only, so the call in flight and the consumers carry on."""
    server = await make_unit("test.server")
    client, in_flight, gate = await _call_in_flight(make_unit, server)
    forged = client.bus.make_message({}, kind="alert", name="t.forged", message_id="forged-1")
    forged.user_id = "somebody-else"
    with pytest.raises(Exception):  # noqa: B017 - aio-pika's channel error, whatever its class
        await client.bus.publish("alert", "t.forged", forged)
    gate.set()
    assert await in_flight == "still here"
    assert await client.call("t.gated", timeout=60) == "still here"


async def test_per_endpoint_body_limit(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.small", max_body_bytes=1024)
    async def small(text: str) -> int:
        return len(text)

    @server.rpc("t.roomy")
    async def roomy(text: str) -> int:
        return len(text)

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    with pytest.raises(RequestFailed, match="exceeds the limit of 1024") as info:
        await client.call("t.small", {"text": "z" * 2048}, timeout=60)
    assert info.value.id == "too_large"
    assert await client.call("t.roomy", {"text": "z" * 2048}) == 2048  # the unit-wide limit applies there
    assert await client.call("t.small", {"text": "ok"}) == 2


@pytest.mark.rabbitmq_only
async def test_a_guaranteed_reply_the_broker_refuses_serves_the_request_again(make_unit: MakeUnit) -> None:
    """A guaranteed request is acked only once its reply is confirmed. A reply the broker nacks (here a full
    reject-publish queue bound to the caller's reply key; in a cluster, a quorum reply queue electing a new
    leader after a node loss) is published again a few times, then the request goes back to its queue
    instead of being acked with its answer lost: it is served again (at least once). The server keeps no
    answers here, so it runs the handler again; by default it would answer from the first run's outcome
    (tests/qbroker/core/test_guaranteed_delivery.py)."""
    server = await make_unit("test.server", guaranteed_answers_kept=0)
    runs: list[str | None] = []
    again = asyncio.Event()

    @server.rpc("t.refused_reply")
    async def work(ctx: RequestContext) -> int:
        runs.append(ctx.message_id)
        if len(runs) == 2:
            again.set()
        return len(runs)

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert client.connection is not None
    channel = await client.connection.channel()
    full = await channel.declare_queue(
        "", exclusive=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    await full.bind(client.config.exchange_name("reply"), routing_key=client.uuid)
    refused_on = server.bus.publishing.channel
    call = asyncio.ensure_future(client.call("t.refused_reply", guarantee=True, timeout=60))
    await asyncio.wait_for(again.wait(), 60)
    # and publishes on fresh channels from the first nack on: RabbitMQ 3.10 goes on nacking a quorum queue on a
    # channel whose publish to it was refused during a leader election (seen on harness/rabbitmq_cluster.py)
    assert server.bus.publishing.channel is not refused_on
    await full.delete()
    assert await asyncio.wait_for(call, 60) in (1, 2)  # the first answer to arrive (each was nacked, not lost)
    assert runs[0] == runs[1]  # one request, served twice
