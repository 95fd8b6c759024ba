"""Delivery semantics: queue deadlines, detach, handler timeouts, prefetch, priorities, standby."""

from __future__ import annotations

import asyncio

import pytest

from harness import HANG, eventually
from qbroker import CallTimeout, HandlerTimeout, RequestContext, TimedOutInQueue
from tests.conftest import MakeUnit
from tests.qbroker.core.waits import until_ready_messages


async def test_request_expiring_in_queue_is_answered_error(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    release = asyncio.Event()
    busy = asyncio.Event()

    @server.rpc("t.slow", prefetch=1)
    async def slow() -> str:
        busy.set()
        await release.wait()
        return "done"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    first = asyncio.create_task(client.call("t.slow", timeout=HANG))
    await asyncio.wait_for(busy.wait(), HANG)  # the only prefetch slot is taken: the next request waits
    # The request expires in its queue a second before the caller's deadline: TimedOutInQueue is the
    # dead-letter path's answer (our own deadline would raise CallTimeout).
    with pytest.raises(TimedOutInQueue) as info:
        await client.call("t.slow", timeout=4)
    assert info.value.status == "error"
    release.set()
    assert await first == "done"


async def test_detached_handler_frees_its_slot(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    release = asyncio.Event()
    detached: list[str | None] = []

    @server.rpc("t.wait", prefetch=1)
    async def wait(ctx: RequestContext, quick: bool = False) -> str:
        if quick:
            return "quick"
        await ctx.detach()
        detached.append(ctx.message_id)
        await release.wait()
        return "waited"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    waiters = [asyncio.create_task(client.call("t.wait", timeout=HANG)) for _ in range(5)]
    await eventually(lambda: len(detached) == 5, timeout=HANG)
    # Five long waits are running and prefetch is 1, yet a quick request is served.
    assert await client.call("t.wait", {"quick": True}, timeout=HANG) == "quick"
    release.set()
    assert await asyncio.gather(*waiters) == ["waited"] * 5


async def test_handler_timeout_and_call_timeout(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    never = asyncio.Event()  # set only at the end, so both handlers would wait until then

    @server.rpc("t.bounded", timeout=0.2)
    async def bounded() -> None:
        await never.wait()

    @server.rpc("t.sleepy")
    async def sleepy() -> str:
        await never.wait()
        return "late"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    with pytest.raises(HandlerTimeout, match="0.2s"):
        await client.call("t.bounded", timeout=HANG)
    with pytest.raises(CallTimeout):
        await client.call("t.sleepy", timeout=0.5)
    never.set()


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
    busy = asyncio.Event()

    @server.rpc("t.prio", prefetch=1, max_priority=9)
    async def prio(n: int) -> None:
        busy.set()
        await gate.wait()
        order.append(n)

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    first = asyncio.create_task(client.call("t.prio", {"n": -1}, timeout=HANG))
    await asyncio.wait_for(busy.wait(), HANG)
    calls = [asyncio.create_task(client.call("t.prio", {"n": n}, priority=n, timeout=HANG)) for n in (1, 5, 9, 3)]
    await until_ready_messages(client, server.config.queue_name("rpc", "t.prio"), 4)  # all four wait
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
    started: list[int] = []
    release = asyncio.Event()

    @server.rpc("t.drain")
    async def drain(n: int) -> int:
        started.append(n)
        await release.wait()
        return n

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    calls = [asyncio.create_task(client.call("t.drain", {"n": n}, timeout=HANG)) for n in range(5)]
    await eventually(lambda: len(started) == 5, timeout=HANG)
    stopping = asyncio.create_task(server.stop(drain_timeout=HANG))
    await eventually(lambda: server.state == "stopping", timeout=HANG)
    release.set()  # the handlers finish only now, while the unit is stopping: the drain waits for them
    await asyncio.wait_for(stopping, HANG)
    assert sorted(await asyncio.gather(*calls)) == list(range(5))
