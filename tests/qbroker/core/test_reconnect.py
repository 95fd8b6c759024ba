"""Broker loss: calls in flight fail fast, units reconnect, re-declare and serve again; failover.

These tests restart a private RabbitMQ node started for them, never the user's broker.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from harness import HANG, eventually
from harness.private_node import PrivateNode, start_private_node, stop_private_node
from qbroker import BrokerUnavailable, Config, QBrokerError, Unit

# Restarts a private RabbitMQ node; tests/qbroker/core/test_memory_broker.py covers reconnects in memory.
pytestmark = pytest.mark.rabbitmq_only


@pytest.fixture(scope="module")
def private_node() -> Iterator[PrivateNode]:
    node = start_private_node()
    yield node
    stop_private_node(node)


def _unit(app: str, url: str) -> Unit:
    return Unit(app, config=Config(url=url, heartbeat=5, reconnect_backoff_max=0.5, connect_timeout=2))


async def _echo_server(url: str, *, hold_from: int | None = None, release: asyncio.Event | None = None) -> Unit:
    """An echo server; with ``hold_from``, requests from that number on wait for ``release``."""
    server = _unit("test.server", url)

    @server.rpc("t.echo")
    async def echo(n: int) -> int:
        await asyncio.sleep(0.005)
        if hold_from is not None and release is not None and n >= hold_from:
            await release.wait()
        return n

    await server.start()
    return server


async def _call_until_ok(client: Unit, name: str, n: int, within: float) -> None:
    async def answered() -> bool:
        return await client.call(name, {"n": n}, timeout=2) == n

    await eventually(answered, within, 0.2)  # a ceiling against hangs, not a speed claim


async def test_broker_restart_mid_traffic(private_node: PrivateNode) -> None:
    server = await _echo_server(private_node.url)
    client = _unit("test.client", private_node.url)
    await client.start()
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()

    async def worker(w: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                # Every call must resolve: a hang would trip this outer bound.
                result = await asyncio.wait_for(client.call("t.echo", {"n": n}, timeout=3), 10)
                assert result == n
                outcomes["ok"] += 1
            except QBrokerError as exc:
                outcomes[exc.id] += 1
                await asyncio.sleep(0.05)

    try:
        workers = [asyncio.create_task(worker(w)) for w in range(16)]
        await eventually(lambda: outcomes["ok"] >= 16, timeout=HANG)  # traffic flows
        before = outcomes["ok"]
        await asyncio.to_thread(private_node.stop_app)
        await eventually(lambda: sum(outcomes.values()) > outcomes["ok"], timeout=HANG)  # calls fail
        await asyncio.to_thread(private_node.start_app)
        await _call_until_ok(client, "t.echo", 7, within=HANG)
        after = outcomes["ok"]
        await eventually(lambda: outcomes["ok"] >= after + 16, timeout=HANG)  # the workers are served again
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 20)
        assert before > 0
        assert outcomes["ok"] > before, outcomes  # traffic flowed again after the restart
        failures = {k: v for k, v in outcomes.items() if k != "ok"}
        assert failures, "the restart should have interrupted some calls"
        assert set(failures) <= {"connection_lost", "call_timeout", "queue_timeout"}, failures
        assert client.pending.__len__() == 0
    finally:
        await client.stop()
        await server.stop()


async def test_failover_to_the_next_broker(private_node: PrivateNode, amqp_url: str) -> None:
    urls = f"{private_node.url},{amqp_url}"
    server = await _echo_server(urls)
    client = _unit("test.client", urls)
    await client.start()
    try:
        assert await client.call("t.echo", {"n": 1}) == 1
        await asyncio.to_thread(private_node.stop_app)
        try:
            await _call_until_ok(client, "t.echo", 2, within=20)
            assert client.bus.supervisor.url_index == 1
        finally:
            await asyncio.to_thread(private_node.start_app)
    finally:
        await client.stop()
        await server.stop()


async def test_unreachable_broker_is_a_clear_error() -> None:
    unit = _unit("test.client", "amqp://guest:secret@127.0.0.1:1/")
    with pytest.raises(BrokerUnavailable) as info:
        await unit.start()
    assert "127.0.0.1:1" in info.value.message
    assert "secret" not in info.value.message


async def test_broker_restart_with_1000_calls_in_flight(private_node: PrivateNode) -> None:
    """1000 calls in flight when the broker stops: every one resolves (its result or a clear error, no
    hang), and the service answers again after the broker is back. Prints the figures that
    docs/reliability.md keeps (bench/chaos.py restart runs this)."""
    # Calls from 500 on are held by the server until the broker is stopping, so however fast the first
    # ones go, the stop cuts calls in flight off.
    release = asyncio.Event()
    server = await _echo_server(private_node.url, hold_from=500, release=release)
    client = _unit("test.client", private_node.url)
    await client.start()
    outcomes: Counter[str] = Counter()

    async def one(n: int) -> None:
        try:
            # The outer bound only catches a hang; the call's own timeout is 30 s.
            assert await asyncio.wait_for(client.call("t.echo", {"n": n}, timeout=30), HANG) == n
            outcomes["ok"] += 1
        except QBrokerError as exc:
            outcomes[exc.id] += 1

    try:
        calls = [asyncio.create_task(one(n)) for n in range(1000)]
        await eventually(lambda: outcomes["ok"] >= 50, timeout=HANG)
        in_flight = len(client.pending)
        stopping = asyncio.create_task(asyncio.to_thread(private_node.stop_app))
        await eventually(lambda: client.bus.connection is None or client.bus.connection.is_closed, timeout=HANG)
        release.set()
        await stopping
        await asyncio.wait_for(asyncio.gather(*calls), HANG)  # every call resolved while the broker is down
        started = time.monotonic()
        await asyncio.to_thread(private_node.start_app)
        app_up = time.monotonic() - started
        await _call_until_ok(client, "t.echo", 1, within=HANG)
        resumed = time.monotonic() - started
        assert sum(outcomes.values()) == 1000
        assert set(outcomes) <= {"ok", "connection_lost", "call_timeout", "queue_timeout"}, outcomes
        assert outcomes["connection_lost"] > 0, outcomes  # the restart did cut calls off
        print(
            f"\nRESTART-1000: in flight at stop {in_flight}, outcomes {dict(outcomes)}, "
            f"broker app start {app_up:.1f}s, service answering {resumed:.1f}s after start_app"
        )
    finally:
        await client.stop()
        await server.stop()


async def test_a_guaranteed_request_survives_a_broker_restart(private_node: PrivateNode) -> None:
    """EventMQ guarantee: persistent, confirmed, kept by the broker through its restart, answered after it."""
    name = "t.guaranteed"
    served: list[int] = []

    def server_unit() -> Unit:
        server = _unit("test.server", private_node.url)

        @server.rpc(name)
        async def work(n: int) -> int:
            served.append(n)
            return n * 2

        return server

    first = server_unit()
    await first.start()  # declares rpc_t.guaranteed (durable)
    await first.stop()  # nobody serves it now: the request will wait in the queue
    client = Unit(
        "test.client",
        config=Config(
            url=private_node.url, heartbeat=5, reconnect_backoff_max=0.5, connect_timeout=2, durable_reply_queue=True
        ),
    )
    await client.start()
    second: Unit | None = None
    try:
        call = asyncio.create_task(client.call(name, {"n": 21}, timeout=HANG, guarantee=True))

        await eventually(lambda: private_node.ready_messages(f"rpc_{name}") == 1, timeout=HANG, interval=0.2)
        await asyncio.to_thread(private_node.stop_app)
        await asyncio.to_thread(private_node.start_app)
        assert not call.done()  # a guaranteed call outlives the lost connection
        second = server_unit()  # a server comes back after the restart and finds the request
        await second.start()
        assert await asyncio.wait_for(call, HANG) == 42
        assert served == [21]
    finally:
        await client.stop()
        if second is not None:
            await second.stop()
