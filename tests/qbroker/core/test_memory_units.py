"""Units on the in-memory broker: broker-side faults (dropped connections, restart, failover) and the
test helpers of ``qbroker.testing``."""

from __future__ import annotations

import asyncio

import pytest

from harness import eventually
from qbroker import BrokerUnavailable, Config, ConnectionLost, NoServer, Unit
from qbroker.testing import MemoryBroker, broker_of, memory_config, running


def _connected(*units: Unit) -> bool:
    """Reconnected: the supervisor replaced the dropped connection with a live one."""
    return all(u.connection is not None and not u.connection.is_closed for u in units)


def _echo_server(config: Config) -> tuple[Unit, asyncio.Event]:
    server = Unit("test.server", config=config)
    release = asyncio.Event()
    release.set()

    @server.rpc("m.echo")
    async def echo(n: int) -> int:
        await release.wait()
        return n

    return server, release


async def test_drop_connections_fails_calls_in_flight_then_units_reconnect() -> None:
    server, release = _echo_server(memory_config(reconnect_backoff_max=0.2))
    client = Unit("test.client", config=server.config)
    broker = broker_of(server.config)
    async with running(server, client):
        assert await client.call("m.echo", {"n": 1}) == 1
        release.clear()
        in_flight = asyncio.create_task(client.call("m.echo", {"n": 2}, timeout=10))
        await eventually(lambda: broker.queue_info("rpc_m.echo").unacked == 1)
        old_connection = server.connection
        assert broker.drop_connections() == 2
        with pytest.raises(ConnectionLost):  # failed by the loss, not at its deadline (CallTimeout)
            await in_flight
        release.set()
        await eventually(lambda: _connected(server, client))
        assert server.connection is not old_connection
        # Both units re-declared their queues and consume again.
        assert await client.call("m.echo", {"n": 3}, timeout=5) == 3
        assert broker.queue_info("rpc_m.echo").consumers == 1


async def test_restart_loses_transient_state_and_units_redeclare_it() -> None:
    server, _ = _echo_server(memory_config(reconnect_backoff_max=0.2))
    client = Unit("test.client", config=server.config)
    broker = broker_of(server.config)
    async with running(server, client):
        reply_queue = f"reply_{client.uuid}"
        assert reply_queue in broker.queue_names()
        broker.restart()
        assert reply_queue not in broker.queue_names()  # exclusive: gone with the connection
        assert "rpc_m.echo" in broker.queue_names()  # durable: survives
        await eventually(lambda: _connected(server, client))
        assert reply_queue in broker.queue_names()
        assert await client.call("m.echo", {"n": 4}, timeout=5) == 4


async def test_failover_to_the_next_memory_broker() -> None:
    primary, secondary = memory_config(), memory_config()
    urls = f"{primary.url},{secondary.url}"
    server, _ = _echo_server(Config(url=urls, reconnect_backoff_max=0.2))
    client = Unit("test.client", config=server.config)
    async with running(server, client):
        assert await client.call("m.echo", {"n": 1}) == 1
        down = broker_of(primary)
        down.available = False
        down.drop_connections()
        await eventually(lambda: _connected(server, client))
        assert client.bus.supervisor.url_index == 1
        assert await client.call("m.echo", {"n": 2}, timeout=5) == 2
        assert "rpc_m.echo" in MemoryBroker.for_url(secondary.url).queue_names()


async def test_broker_down_at_start_is_broker_unavailable() -> None:
    config = memory_config()
    broker_of(config).available = False
    with pytest.raises(BrokerUnavailable, match="no broker reachable"):
        await Unit("test.client", config=config).start()


async def test_memory_configs_are_isolated() -> None:
    server, _ = _echo_server(memory_config())
    elsewhere = Unit("test.client", config=memory_config())
    same = Unit("test.client", config=server.config)
    async with running(server, elsewhere, same):
        with pytest.raises(NoServer):
            await elsewhere.call("m.echo", {"n": 1}, timeout=2)
        assert await same.call("m.echo", {"n": 1}) == 1


async def test_running_stops_units_when_the_body_fails() -> None:
    server, _ = _echo_server(memory_config())
    with pytest.raises(RuntimeError, match="test body failed"):
        async with running(server):
            assert server.state == "started"
            raise RuntimeError("test body failed")
    assert server.state == "stopped"
    assert broker_of(server.config).connections == []


async def test_running_stops_started_units_when_a_later_start_fails() -> None:
    server, _ = _echo_server(memory_config())
    down = memory_config()
    broker_of(down).available = False
    with pytest.raises(BrokerUnavailable):
        async with running(server, Unit("test.client", config=down)):
            raise AssertionError("the body must not run")
    assert server.state == "stopped"
