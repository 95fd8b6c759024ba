"""RQ / EventMQ semantics on AMQP: one-way requests, server-side retries, schedules."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness import HANG, eventually
from qbroker import RequestError, RequestFailed
from tests.conftest import MakeUnit


async def test_cast_is_handled_once_without_reply(make_unit: MakeUnit) -> None:
    handled: list[int] = []
    servers = []
    for i in range(2):
        server = await make_unit(f"test.server{i}")
        servers.append(server)

        @server.rpc("t.cast")
        async def one_way(n: int) -> int:
            handled.append(n)
            return n

        await server.start()
    client = await make_unit("test.client")
    await client.start()
    for n in range(10):
        await client.cast("t.cast", {"n": n})
    await eventually(lambda: len(handled) == 10, timeout=HANG)
    for server in servers:
        await server.stop(drain_timeout=HANG)  # whatever was delivered has been handled now
    assert sorted(handled) == list(range(10))  # load-balanced, each exactly once


async def test_server_side_retries_for_error_not_fail(make_unit: MakeUnit) -> None:
    attempts = {"flaky": 0, "broken": 0}
    server = await make_unit("test.server")

    @server.rpc("t.flaky", retries=3)
    async def flaky(kind: str) -> str:
        attempts[kind] += 1
        if kind == "flaky" and attempts[kind] < 3:
            raise RequestError("db_down", "database unavailable")
        if kind == "broken":
            raise RequestFailed("bad_input", "cannot be fixed by retrying")
        return "ok"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.flaky", {"kind": "flaky"}) == "ok"
    assert attempts["flaky"] == 3
    with pytest.raises(RequestFailed):
        await client.call("t.flaky", {"kind": "broken"})
    assert attempts["broken"] == 1


async def test_schedule_every_and_nohaste_and_unschedule(make_unit: MakeUnit) -> None:
    ticks: list[str] = []
    alerts: list[object] = []
    server = await make_unit("test.server")

    @server.rpc("t.tick")
    async def tick(source: str) -> None:
        ticks.append(source)

    @server.on_alert("t.scheduled_alert")
    async def on_alert(body: object) -> None:
        alerts.append(body)

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    # Not nohaste: the first send goes at once, so "slow" arrives although its interval is never reached.
    client.schedule("t.tick", {"source": "slow"}, every=10 * HANG)
    repeating = client.schedule("t.tick", {"source": "fast"}, every=0.2)
    delayed = client.schedule("t.scheduled_alert", {"x": 1}, every=0.3, kind="alert", nohaste=True)
    assert delayed.next_delay(time.time(), first=True) == 0.3  # nohaste: the first send waits one interval
    await eventually(lambda: "slow" in ticks and ticks.count("fast") >= 4 and alerts, timeout=HANG)
    assert ticks.count("slow") == 1
    assert client.unschedule(repeating.id)
    assert repeating.task is not None
    await asyncio.wait_for(asyncio.gather(repeating.task, return_exceptions=True), HANG)
    assert repeating.task.cancelled()  # no further sends can happen
    assert not client.unschedule(repeating.id)
    assert alerts[0] == {"x": 1}
    with pytest.raises(ValueError, match="cron"):
        client.schedule("t.tick", cron="not a cron line")
