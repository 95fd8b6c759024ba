"""Weighted workers (EventMQ worker weights, RQ consume PRIORITY) as RabbitMQ consumer priorities."""

from __future__ import annotations

import asyncio

from harness import HANG, eventually
from tests.conftest import MakeUnit


async def test_a_heavier_server_gets_work_first_and_a_lighter_one_only_when_it_is_full(
    make_unit: MakeUnit, transport: str
) -> None:
    heavy, light, client = (
        await make_unit("test.heavy"),
        await make_unit("test.light"),
        await make_unit("test.client"),
    )
    release = asyncio.Event()
    served: list[str] = []

    def server(unit_name: str) -> object:
        async def handle(block: bool = False) -> str:
            served.append(unit_name)
            if block:
                await release.wait()
            return unit_name

        return handle

    # Room for two on the heavy server: a server acks after its reply, so the next sequential call may reach
    # the broker before the last one's ack does; with a prefetch of 1 that call would find the heavy server full.
    heavy.rpc("test.weighted", prefetch=2, priority=10)(server("heavy"))
    light.rpc("test.weighted", prefetch=1)(server("light"))  # the default priority, 0: a standby
    for unit in (light, heavy, client):
        await unit.start()

    for _ in range(10):  # the heavy server is never full between sequential calls: it takes them all
        assert await client.call("test.weighted", {}) == "heavy"

    held = []
    for count in (11, 12):  # one at a time: each finds the one before acked, the heavy server room for it
        held.append(asyncio.create_task(client.call("test.weighted", {"block": True}, timeout=HANG)))
        await eventually(lambda count=count: served.count("heavy") == count, timeout=HANG)
    # heavy holds two: at its prefetch
    assert await client.call("test.weighted", {}) == "light"  # so the standby gets the next one
    release.set()
    assert await asyncio.gather(*held) == ["heavy", "heavy"]
    assert await client.call("test.weighted", {}) == "heavy"  # free again: back to the heavy one
