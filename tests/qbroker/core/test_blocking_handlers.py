"""Blocking sync handlers run in a bounded pool: the loop, heartbeats and timeouts keep going; a request
that keeps killing its servers is answered ``poison_request`` instead of looping."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from harness import HANG
from qbroker import HandlerTimeout, PoisonRequest
from tests.conftest import MakeUnit


async def test_blocking_sync_handler_times_out_and_spares_the_loop(make_unit: MakeUnit) -> None:
    entered, release = threading.Event(), threading.Event()
    server = await make_unit("test.server")

    @server.rpc("t.block", timeout=0.3)
    def block() -> str:
        entered.set()
        release.wait(HANG)
        return "late"

    @server.rpc("t.ping")
    async def ping() -> str:
        return "pong"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    try:
        blocked = asyncio.ensure_future(client.call("t.block", timeout=HANG))
        assert await asyncio.to_thread(entered.wait, HANG)
        assert await client.call("t.ping", timeout=HANG) == "pong"  # the server's loop is free
        with pytest.raises(HandlerTimeout, match="did not answer within 0.3s"):
            await blocked
    finally:
        release.set()


async def test_sync_handlers_share_a_bounded_pool(make_unit: MakeUnit) -> None:
    lock = threading.Lock()
    running = [0, 0]  # now, most at once
    server = await make_unit("test.server", sync_handler_threads=2)

    @server.rpc("t.sync")
    def work(n: int) -> int:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return n

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    results = await asyncio.gather(*(client.call("t.sync", {"n": i}, timeout=HANG) for i in range(8)))
    assert results == list(range(8))
    assert running[1] <= 2


@pytest.mark.rabbitmq_only
async def test_heartbeats_go_on_while_a_sync_handler_blocks(make_unit: MakeUnit) -> None:
    """With a 1 s heartbeat RabbitMQ drops a connection silent for 2 s; the handler sleeps 3 s in its
    thread and its reply still arrives on the same connection."""
    server = await make_unit("test.server", heartbeat=1)

    @server.rpc("t.sleepy")
    def sleepy() -> str:
        time.sleep(3)
        return "rested"

    await server.start()
    connection = server.connection
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.sleepy", timeout=HANG) == "rested"
    assert server.connection is connection and connection is not None and not connection.is_closed


def hanging(started: asyncio.Event):  # type: ignore[no-untyped-def]
    async def poison() -> None:
        started.set()
        await asyncio.Event().wait()

    return poison


async def test_request_that_kills_its_servers_becomes_poison(make_unit: MakeUnit) -> None:
    client = await make_unit("test.client")
    await client.start()
    pending: asyncio.Future[object] | None = None
    for round_ in range(2):
        server = await make_unit(f"test.server{round_}", max_redeliveries=2)
        started = asyncio.Event()
        server.rpc("t.poison")(hanging(started))
        await server.start()
        if pending is None:
            pending = asyncio.ensure_future(client.call("t.poison", timeout=HANG))
        await asyncio.wait_for(started.wait(), HANG)
        await server.kill()  # the request is redelivered to the next server
    assert pending is not None
    ran = []
    last = await make_unit("test.last", max_redeliveries=2)

    @last.rpc("t.poison")
    async def never() -> None:
        ran.append(1)

    await last.start()
    with pytest.raises(PoisonRequest, match="ended 2 deliveries without an answer"):
        await pending
    assert ran == []
