"""qbroker.metrics: what a unit handles and sends (status, error id, durations, in flight), its reconnects and
the dead requests its collector answers."""

from __future__ import annotations

import asyncio

import pytest

from harness import HANG, eventually
from qbroker import RequestFailed
from qbroker.errors import BadMessage, NoServer
from qbroker.metrics import OTHER, UnitMetrics, instrument, serve
from tests.prometheus_text import scrape, value


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


async def test_calls_errors_in_flight_reconnects_and_dead_letters(make_unit) -> None:
    """Both sides of the library's metrics, read as Prometheus reads them (/metrics), on the real broker."""
    server = await make_unit("test.metrics.server3")
    release = asyncio.Event()

    @server.rpc("test.metrics.slow")
    async def slow() -> str:
        await release.wait()
        return "done"

    @server.rpc("test.metrics.check")
    async def check(n: int) -> int:
        if n == -1:
            raise RequestFailed("negative", "n must not be negative")
        if n == -2:
            raise RequestFailed("made_up_by_a_peer", "an id this program does not define")
        if n == -3:
            raise ValueError("three")
        return n

    @server.on_alert("test.metrics.census")
    async def census() -> str:
        return "here"

    client = await make_unit("test.metrics.client3", max_body_bytes=10_000)
    assert not client.bus.middleware.senders  # an uninstrumented unit: no send hook on its calls
    metrics = UnitMetrics(error_ids=["negative"])  # one registry for both units: side tells them apart
    instrument(server, metrics)
    instrument(client, metrics)
    await server.start()
    await client.start()
    http = serve(metrics, 0)
    port = http.server_address[1]
    try:
        waiting = asyncio.ensure_future(client.call("test.metrics.slow", timeout=HANG))

        def both_in_flight() -> bool:
            text = scrape(port)
            return (
                value(text, 'qbroker_calls_in_flight{kind="call"}') == 1
                and value(text, 'qbroker_handlers_in_flight{kind="rpc"}') == 1
            )

        await eventually(both_in_flight)
        release.set()
        assert await waiting == "done"
        assert await client.call("test.metrics.check", {"n": 2}) == 2
        for n, error in ((-1, RequestFailed), (-2, RequestFailed), (-3, ValueError)):
            with pytest.raises(error):
                await client.call("test.metrics.check", {"n": n})
        with pytest.raises(NoServer):  # answered by a dead-letter collector (both units run one)
            await client.call("test.metrics.nobody")
        with pytest.raises(BadMessage):  # refused before it leaves: over the client's max_body_bytes
            await client.call("test.metrics.check", {"n": 1, "pad": "x" * 20_000})
        await client.cast("test.metrics.check", {"n": 3})
        await client.alert("test.metrics.census-unheard", {})
        assert [reply.body async for reply in client.gather("test.metrics.census", max_replies=1, timeout=HANG)] == [
            "here"
        ]

        def settled() -> str | None:
            text = scrape(port)
            handled = value(text, 'qbroker_handled_total{endpoint="test.metrics.check",kind="rpc",status="ok"}')
            return text if handled == 2 else None  # the call and the cast

        text = await eventually(settled)
        calls = 'qbroker_calls_total{endpoint="test.metrics.%s",kind="%s",status="%s"}'
        assert value(text, calls % ("slow", "call", "ok")) == 1
        assert value(text, calls % ("check", "call", "ok")) == 1
        assert value(text, calls % ("check", "call", "fail")) == 3  # negative, made up, too large
        assert value(text, calls % ("check", "call", "error")) == 1  # ValueError
        assert value(text, calls % ("nobody", "call", "fail")) == 1
        assert value(text, calls % ("check", "cast", "ok")) == 1
        assert value(text, calls % ("census-unheard", "alert", "ok")) == 1
        assert value(text, calls % ("census", "gather", "ok")) == 1
        assert value(text, 'qbroker_call_duration_seconds_count{endpoint="test.metrics.check"}') == 5
        assert value(text, 'qbroker_calls_in_flight{kind="call"}') == 0
        assert value(text, 'qbroker_calls_in_flight{kind="gather"}') == 0
        assert value(text, 'qbroker_handlers_in_flight{kind="rpc"}') == 0
        errors = 'qbroker_errors_total{error_id="%s",side="%s"}'
        for side in ("caller", "handler"):
            assert value(text, errors % ("negative", side)) == 1  # given in error_ids
            assert value(text, errors % ("other", side)) == 1  # made up: not a label of its own
            assert value(text, errors % ("python.ValueError", side)) == 1
        assert value(text, errors % ("no_server", "caller")) == 1
        assert value(text, errors % ("too_large", "caller")) == 1
        assert "made_up_by_a_peer" not in text
        assert value(text, 'qbroker_dead_letters_answered_total{reason="unroutable"}') == 1
        assert value(text, "qbroker_connections") == 2
        assert value(text, "qbroker_reconnects_total") == 0

        # A broken connection (the supervisor's own lever: rabbitmqctl takes seconds per call here).
        client.bus.supervisor.lose(ConnectionError("dropped by the test"))

        def reconnected() -> bool:
            text = scrape(port)
            return value(text, "qbroker_reconnects_total") == 1 and value(text, "qbroker_connections") == 2

        await eventually(reconnected)
    finally:
        http.shutdown()
        http.server_close()


def test_names_with_a_process_id_keep_one_label_across_restarts() -> None:
    """``endpoint_label``: a per-process name (a render thread's ``...<host>.<pid>.<thread>``) counts under one
    stable label, whatever number of processes came and went; ``max_names`` bounds the labels, not the names
    (a thousand restarts are not a thousand names that push the next one into ``other``)."""

    def without_pid(name: str) -> str:
        words = name.split(".")
        return ".".join([*words[:2], "*", *words[3:]]) if len(words) == 4 else name

    metrics = UnitMetrics(max_names=2, endpoint_label=without_pid)
    for pid in range(1000, 2000):  # a thousand restarts of the same worker
        metrics.observe(f"test.worker.{pid}.0", "rpc", "ok", 0.01)
    metrics.observe("test.other", "rpc", "ok", 0.01)
    metrics.observe("test.third", "rpc", "ok", 0.01)  # a third label: over max_names

    def handled(endpoint: str) -> float | None:
        return metrics.registry.get_sample_value(
            "qbroker_handled_total", {"endpoint": endpoint, "kind": "rpc", "status": "ok"}
        )

    assert handled("test.worker.*.0") == 1000
    assert handled("test.other") == 1 and handled(OTHER) == 1
    assert len(metrics._handled_names.known) <= 4 * metrics.max_names  # the names seen are not all kept
