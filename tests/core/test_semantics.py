"""RQ / EventMQ semantics on AMQP: one-way requests, server-side retries, schedules."""

from __future__ import annotations

import asyncio
import time

import pytest

from qbroker import RequestError, RequestFailed
from tests.conftest import MakeUnit


async def _wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def test_cast_is_handled_once_without_reply(make_unit: MakeUnit) -> None:
    handled: list[int] = []
    for i in range(2):
        server = await make_unit(f"test.server{i}")

        @server.rpc("t.cast")
        async def one_way(n: int) -> int:
            handled.append(n)
            return n

        await server.start()
    client = await make_unit("test.client")
    await client.start()
    for n in range(10):
        await client.cast("t.cast", {"n": n})
    await _wait_for(lambda: len(handled) == 10)
    await asyncio.sleep(0.2)
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
    ticks: list[float] = []
    alerts: list[object] = []
    server = await make_unit("test.server")

    @server.rpc("t.tick")
    async def tick() -> None:
        ticks.append(time.monotonic())

    @server.on_alert("t.scheduled_alert")
    async def on_alert(body: object) -> None:
        alerts.append(body)

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    started = time.monotonic()
    schedule = client.schedule("t.tick", every=0.2)
    client.schedule("t.scheduled_alert", {"x": 1}, every=0.3, kind="alert", nohaste=True)
    await _wait_for(lambda: len(ticks) >= 4)
    assert ticks[0] - started < 0.15  # not nohaste: first run at once
    assert client.unschedule(schedule.id)
    count = len(ticks)
    await asyncio.sleep(0.5)
    assert len(ticks) <= count + 1
    assert alerts and alerts[0] == {"x": 1}
    with pytest.raises(ValueError, match="cron"):
        client.schedule("t.tick", cron="not a cron line")
