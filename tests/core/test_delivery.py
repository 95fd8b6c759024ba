"""Delivery semantics: queue deadlines, detach, handler timeouts, prefetch, priorities, standby."""

from __future__ import annotations

import asyncio
import time

import pytest

from qbroker import CallTimeout, HandlerTimeout, RequestContext, TimedOutInQueue
from tests.conftest import MakeUnit


async def test_request_expiring_in_queue_is_answered_error(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    release = asyncio.Event()

    @server.rpc("t.slow", prefetch=1)
    async def slow() -> str:
        await release.wait()
        return "done"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    first = asyncio.create_task(client.call("t.slow", timeout=30))
    await asyncio.sleep(0.2)  # the only prefetch slot is taken: the next request waits in the queue
    started = time.perf_counter()
    with pytest.raises(TimedOutInQueue) as info:
        await client.call("t.slow", timeout=1.5)
    assert info.value.status == "error"
    assert time.perf_counter() - started < 1.5  # answered by the dead-letter path, not our own timeout
    release.set()
    assert await first == "done"


async def test_detached_handler_frees_its_slot(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    release = asyncio.Event()

    @server.rpc("t.wait", prefetch=1)
    async def wait(ctx: RequestContext, quick: bool = False) -> str:
        if quick:
            return "quick"
        await ctx.detach()
        await release.wait()
        return "waited"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    waiters = [asyncio.create_task(client.call("t.wait", timeout=20)) for _ in range(5)]
    await asyncio.sleep(0.3)
    # Five long waits are running and prefetch is 1, yet a quick request is served at once.
    assert await client.call("t.wait", {"quick": True}, timeout=2) == "quick"
    release.set()
    assert await asyncio.gather(*waiters) == ["waited"] * 5


async def test_handler_timeout_and_call_timeout(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.bounded", timeout=0.2)
    async def bounded() -> None:
        await asyncio.sleep(5)

    @server.rpc("t.sleepy")
    async def sleepy(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    with pytest.raises(HandlerTimeout, match="0.2s"):
        await client.call("t.bounded", timeout=5)
    with pytest.raises(CallTimeout):
        await client.call("t.sleepy", {"seconds": 2}, timeout=0.5)


async def test_prefetch_bounds_concurrency(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    running = 0
    peak = 0

    @server.rpc("t.bounded_concurrency", prefetch=3)
    async def work() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    await asyncio.gather(*(client.call("t.bounded_concurrency", timeout=20) for _ in range(20)))
    assert peak == 3


async def test_priorities_reorder_waiting_requests(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    order: list[int] = []
    gate = asyncio.Event()

    @server.rpc("t.prio", prefetch=1, max_priority=9)
    async def prio(n: int) -> None:
        await gate.wait()
        order.append(n)

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    first = asyncio.create_task(client.call("t.prio", {"n": -1}, timeout=20))
    await asyncio.sleep(0.2)
    calls = [asyncio.create_task(client.call("t.prio", {"n": n}, priority=n, timeout=20)) for n in (1, 5, 9, 3)]
    await asyncio.sleep(0.3)
    gate.set()
    await asyncio.gather(first, *calls)
    assert order == [-1, 9, 5, 3, 1]


async def test_single_active_consumer_is_a_standby(make_unit: MakeUnit) -> None:
    served_by: list[str] = []
    units = []
    for i in range(2):
        unit = await make_unit(f"test.standby{i}")

        @unit.rpc("t.standby", single_active=True)
        async def who(unit_name: str = f"s{i}") -> str:
            served_by.append(unit_name)
            return unit_name

        await unit.start()
        units.append(unit)
    client = await make_unit("test.client")
    await client.start()
    assert {await client.call("t.standby") for _ in range(10)} == {"s0"}
    await units[0].stop()
    assert await client.call("t.standby", timeout=5) == "s1"


async def test_graceful_stop_drains_running_handlers(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    finished: list[int] = []

    @server.rpc("t.drain")
    async def drain(n: int) -> int:
        await asyncio.sleep(0.3)
        finished.append(n)
        return n

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    calls = [asyncio.create_task(client.call("t.drain", {"n": n}, timeout=10)) for n in range(5)]
    await asyncio.sleep(0.1)
    await server.stop(drain_timeout=5)
    assert sorted(await asyncio.gather(*calls)) == list(range(5))
