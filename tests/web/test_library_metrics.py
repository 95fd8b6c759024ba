"""qbroker.metrics: a unit's handled requests and alerts, by endpoint and status, with durations."""

from __future__ import annotations

import asyncio

import pytest

from qbroker import RequestFailed
from qbroker.metrics import OTHER, UnitMetrics, instrument


async def test_handled_requests_and_alerts_are_counted(make_unit) -> None:
    server = await make_unit("test.metrics.server")
    seen = asyncio.Event()

    @server.rpc("test.metrics.work")
    async def work(n: int) -> int:
        if n < 0:
            raise RequestFailed("negative", "n must not be negative")
        return n

    @server.on_alert("test.metrics.#")
    async def heard(body: object) -> None:
        seen.set()

    metrics = instrument(server, UnitMetrics(max_names=2))
    client = await make_unit("test.metrics.client")
    await server.start()
    await client.start()
    for n in (1, 2):
        assert await client.call("test.metrics.work", {"n": n}) == n
    with pytest.raises(RequestFailed):
        await client.call("test.metrics.work", {"n": -1})
    with pytest.raises(RequestFailed):  # invalid parameters: fail, counted too
        await client.call("test.metrics.work", {"n": "x"})
    await client.alert("test.metrics.a", {})
    await asyncio.wait_for(seen.wait(), 10)
    seen.clear()
    await client.alert("test.metrics.b", {})  # a third distinct name: over max_names, counted as "other"
    await asyncio.wait_for(seen.wait(), 10)

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("qbroker_handled_total", endpoint="test.metrics.work", kind="rpc", status="ok") == 2
    assert sample("qbroker_handled_total", endpoint="test.metrics.work", kind="rpc", status="fail") == 2
    assert sample("qbroker_handler_errors_total", endpoint="test.metrics.work", kind="rpc", status="fail") == 2
    assert sample("qbroker_handled_total", endpoint="test.metrics.a", kind="alert", status="ok") == 1
    assert sample("qbroker_handled_total", endpoint=OTHER, kind="alert", status="ok") == 1
    assert sample("qbroker_handler_duration_seconds_count", endpoint="test.metrics.work", kind="rpc") == 4


async def test_a_broken_observer_does_not_lose_the_reply(make_unit) -> None:
    server = await make_unit("test.metrics.broken")

    @server.rpc("test.metrics.echo")
    async def echo(text: str) -> str:
        return text

    def broken(*args: object) -> None:
        raise RuntimeError("observer bug")

    server.handler_observers.append(broken)
    client = await make_unit("test.metrics.client2")
    await server.start()
    await client.start()
    assert await client.call("test.metrics.echo", {"text": "hi"}) == "hi"
