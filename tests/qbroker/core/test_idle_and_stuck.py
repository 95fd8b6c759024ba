"""RQ IDLE and stuck workers: a paused unit gets no new work; a unit whose handler stops making progress
hands its unacknowledged requests to other servers, and takes work again once the handler ends."""

from __future__ import annotations

import asyncio

import pytest

from harness import HANG, eventually
from tests.conftest import MakeUnit


async def test_an_idle_unit_gets_no_new_work_until_it_resumes(make_unit: MakeUnit, transport: str) -> None:
    main, spare, client = await make_unit("test.main"), await make_unit("test.spare"), await make_unit("test.client")

    async def main_work() -> str:
        return "main"

    async def spare_work() -> str:
        return "spare"

    main.rpc("t.work", priority=10)(main_work)  # while it takes work, it gets all of it
    spare.rpc("t.work")(spare_work)
    for unit in (main, spare, client):
        await unit.start()
    assert await client.call("t.work", {}, timeout=HANG) == "main"
    await main.pause()
    assert main.describe()["idle"] is True
    assert [await client.call("t.work", {}, timeout=HANG) for _ in range(5)] == ["spare"] * 5
    await main.resume()
    assert main.describe()["idle"] is False
    assert await client.call("t.work", {}, timeout=HANG) == "main"


# The in-memory broker cancels the handlers of a channel it closes; a real one lets them run on, stuck.
@pytest.mark.rabbitmq_only
async def test_a_stuck_handler_hands_its_work_to_another_server(make_unit: MakeUnit, transport: str) -> None:
    stuck = await make_unit("test.stuck", stuck_after=0.5)
    healthy, client = await make_unit("test.healthy"), await make_unit("test.client")
    release, entered = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    async def hangs(n: int) -> str:
        calls.append(f"stuck:{n}")
        entered.set()
        if n == 1:
            await release.wait()  # alive, but makes no progress
        return "stuck-server"

    async def works(n: int) -> str:
        calls.append(f"healthy:{n}")
        return "healthy-server"

    stuck.rpc("t.job", priority=10)(hangs)  # the first request goes to the server that will hang
    healthy.rpc("t.job")(works)
    for unit in (stuck, healthy, client):
        await unit.start()
    first = asyncio.create_task(client.call("t.job", {"n": 1}, timeout=HANG))
    await asyncio.wait_for(entered.wait(), HANG)
    # The watchdog gives the stuck request back to the broker, which hands it to the healthy server.
    assert await first == "healthy-server"
    assert calls[:2] == ["stuck:1", "healthy:1"]
    # While stuck it takes no new work, even at the higher priority.
    assert await client.call("t.job", {"n": 2}, timeout=HANG) == "healthy-server"
    release.set()  # the handler ends: the unit takes work again
    await eventually(lambda: not stuck.serving._served["t.job"].stuck, timeout=HANG)

    async def back_to_stuck_server() -> bool:
        return await client.call("t.job", {"n": 3}, timeout=HANG) == "stuck-server"

    await eventually(back_to_stuck_server, HANG, 0.05)  # its consumer is re-created just after the handler ends
