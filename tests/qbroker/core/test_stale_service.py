"""A stopped service answers ``no_server`` once gone longer than the grace; a short restart loses nothing;
stale casts expire; servers skip requests whose deadline passed. Waits on broker state, not the clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness import eventually
from qbroker import CallTimeout, NoServer
from tests.conftest import MakeUnit
from tests.qbroker.core.waits import until_queue_gone, until_ready_messages


async def test_stopped_service_answers_no_server_after_grace(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server", rpc_queue_expiry=0.3)

    @server.rpc("t.stale")
    async def stale() -> str:
        return "here"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.stale") == "here"
    await server.stop()
    await until_queue_gone(client, "rpc_t.stale")  # the broker's x-expires, not our clock
    # Answered by the dead-letter collector, not the caller's own 30 s deadline (that is CallTimeout).
    started = time.monotonic()
    with pytest.raises(NoServer, match="no server for t.stale"):
        await client.call("t.stale", timeout=30)
    print(
        f"\nSTALE: no_server answered {1000 * (time.monotonic() - started):.1f} ms after the call, "
        "once the queue had expired"
    )  # a figure for docs/reliability.md, not an assertion


async def test_requests_queued_during_a_restart_are_served(make_unit: MakeUnit) -> None:
    first = await make_unit("test.server")  # default grace (30 s): the restart is shorter

    @first.rpc("t.restart")
    async def one() -> str:
        return "first"

    await first.start()
    client = await make_unit("test.client")
    await client.start()
    await first.stop()
    pending = asyncio.ensure_future(client.call("t.restart", timeout=60))
    await until_ready_messages(client, "rpc_t.restart", 1)
    second = await make_unit("test.server")

    @second.rpc("t.restart")
    async def two() -> str:
        return "second"

    await second.start()
    assert await pending == "second"


async def test_casts_expire_instead_of_running_stale(make_unit: MakeUnit) -> None:
    handled: list[int] = []
    server = await make_unit("test.server")

    @server.rpc("t.cast")
    async def work(n: int) -> None:
        handled.append(n)

    await server.start()
    client = await make_unit("test.client", cast_ttl=0.1)
    await client.start()
    await server.stop()  # the queue stays (grace), nobody consumes it
    await client.cast("t.cast", {"n": 1})  # the default TTL (cast_ttl) applies
    collector = client.dead_letters
    assert collector is not None
    await eventually(lambda: collector.counts["rpc.expired"] >= 1)  # the stale cast dead-lettered as expired
    again = await make_unit("test.server")
    done = asyncio.Event()

    @again.rpc("t.cast")
    async def work2(n: int) -> None:
        handled.append(n)
        done.set()

    await again.start()
    await client.cast("t.cast", {"n": 2}, ttl=60)
    await asyncio.wait_for(done.wait(), 60)
    assert handled == [2]  # FIFO: the stale cast would have come first


async def test_server_skips_request_past_its_deadline(make_unit: MakeUnit) -> None:
    ran: list[str] = []
    server = await make_unit("test.server")

    @server.rpc("t.late")
    async def late() -> str:
        ran.append("late")
        return "ran"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    reply_future = client.pending.expect("late-1")
    message = client.bus.make_message(
        {}, kind="rpc", name="t.late", message_id="late-1", reply_to=client.uuid, deadline=time.time() - 3600
    )
    await client.bus.publish("rpc", "t.late", message)
    reply = await asyncio.wait_for(reply_future, 60)
    assert reply.error is not None and reply.error.id == "deadline_passed"
    assert ran == []  # the reply is sent instead of running the handler, so this is final
    assert await client.call("t.late") == "ran"


async def test_timeout_says_nobody_collects_dead_letters(make_unit: MakeUnit) -> None:
    prefix = f"nocollector-{time.monotonic_ns()}."
    server = await make_unit("test.server", exchange_prefix=prefix, dead_letters=False)

    @server.rpc("t.hang")
    async def hang() -> None:
        await asyncio.Event().wait()

    await server.start()
    client = await make_unit("test.client", exchange_prefix=prefix, dead_letters=False)
    await client.start()
    with pytest.raises(CallTimeout, match="nobody on the bus collects dead letters"):
        await client.call("t.nobody", timeout=0.3)


async def test_queue_declared_without_expiry_is_still_served(make_unit: MakeUnit) -> None:
    """A queue left by an older qbroker (no x-expires) would make every declare fail: serve it as is."""
    client = await make_unit("test.client")
    await client.start()
    assert client.connection is not None
    channel = await client.connection.channel()
    await channel.declare_queue("rpc_t.legacy", durable=True, arguments={"x-dead-letter-exchange": "dead"})
    await channel.close()
    server = await make_unit("test.server")

    @server.rpc("t.legacy")
    async def legacy() -> str:
        return "served"

    await server.start()
    assert await client.call("t.legacy") == "served"


async def test_scheduled_casts_expire_when_the_next_is_due(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.tick")
    async def tick() -> None:
        pass

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    await server.stop()  # the queue stays (grace); nobody consumes the ticks
    client.schedule("t.tick", every=0.2)
    collector = client.dead_letters
    assert collector is not None
    # Each tick's TTL is the interval: the stale ones go to `dead` instead of piling up in the queue.
    await eventually(lambda: collector.counts["rpc.expired"] >= 3)  # scheduled casts dead-lettered as expired
