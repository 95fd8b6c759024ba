"""``qbroker-debug`` survives forged messages and never binds a wildcard from a forged announcement."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from pamqp.commands import Basic

from harness.broker import rabbitmqctl
from tests.qbroker.cli.helpers import Snooper
from tests.seed_client import seed_client


def debug_rpc_binding_keys(vhost: str) -> set[str]:
    out = rabbitmqctl(
        "list_bindings", "-p", vhost, "-q", "--no-table-headers", "source_name", "destination_name", "routing_key"
    ).stdout
    keys = set()
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0] == "rpc" and "debug_" in parts[1]:
            keys.add(parts[2])
    return keys


async def test_forged_x_death_and_wildcard_announcement(amqp_url: str, vhost: str, make_unit: Any) -> None:
    collector = await make_unit("clitest.collector")  # declares the exchanges
    await collector.start()
    snooper = await Snooper.start(amqp_url, "--json")
    try:
        async with seed_client(amqp_url) as forger:
            publish = forger.channel.basic_publish
            forged_deaths: list[Any] = [
                [{"reason": 7, "exchange": ["rpc"], "routing-keys": 5}],
                [{"routing-keys": {"a": 1}}],
                [{"reason": bytearray(b"\xff"), "routing-keys": []}],
                "not a list",
            ]
            for deaths in forged_deaths:
                await publish(
                    b"{}",
                    exchange="dead",
                    routing_key="t.forged",
                    properties=Basic.Properties(
                        headers={"version": 1, "name": ["not", "text"], "x-death": deaths, "app": 3},
                        message_id=uuid.uuid4().hex,
                        content_type="application/json",
                    ),
                )
            # A forged unit announcing endpoints "#" and "a.*": must not be bound.
            fake = uuid.uuid4().hex
            body = {
                "app": "forged",
                "uuid": fake,
                "endpoints": ["#", "a.*", "t.real.name", 5],
                "listeners": ["#", "fine.#"],
            }
            await publish(
                orjson.dumps(body),
                exchange="alert",
                routing_key="qbroker.start",
                properties=Basic.Properties(
                    headers={"version": 1, "name": "qbroker.start"},
                    app_id=fake,
                    message_id=uuid.uuid4().hex,
                    content_type="application/json",
                ),
            )
            for _ in forged_deaths:
                await snooper.next_event(kind="dead", timeout=30)
            await snooper.next_event(kind="alert", name="qbroker.start", uuid=fake, timeout=30)
            # Still alive and following: a well-formed call is shown after all that.
            server = await make_unit("clitest.server")

            @server.rpc("clitest.after.forgery")
            async def after() -> str:
                return "fine"

            await server.start()
            await snooper.next_event(kind="alert", name="qbroker.start", uuid=server.uuid, timeout=30)
            assert await collector.call("clitest.after.forgery", timeout=30) == "fine"
            await snooper.next_event(kind="request", name="clitest.after.forgery", timeout=30)
        keys = debug_rpc_binding_keys(vhost)
        assert "t.real.name" in keys and "clitest.after.forgery" in keys
        assert not {"#", "a.*"} & keys, keys
    finally:
        code, _, _ = await snooper.stop()
    assert code == 0


async def test_dead_servers_names_stop_being_routable_while_a_debugger_runs(
    amqp_url: str, vhost: str, make_unit: Any
) -> None:
    """A per-instance endpoint (like a render thread's) of a unit killed without qbroker.stop: the
    debugger's roll call forgets the unit and unbinds the name, so calls fail fast with no_server."""
    from harness import HANG, eventually
    from qbroker import NoServer

    name = f"clitest.instance.{uuid.uuid4().hex[:8]}"
    server = await make_unit("clitest.instance")

    @server.rpc(name, exclusive=True)
    async def instance() -> str:
        return "alive"

    await server.start()
    client = await make_unit("clitest.client")
    await client.start()
    snooper = await Snooper.start(amqp_url, "--json", "--recheck", "0.3", "--discover-timeout", "0.5")
    try:
        # ceilings only: the debugger starts slowly on a loaded machine
        await eventually(lambda: name in debug_rpc_binding_keys(vhost), timeout=3 * HANG)
        assert await client.call(name, timeout=30) == "alive"
        await server.kill()  # no qbroker.stop: its exclusive queue vanishes, the debugger's binding stays
        await eventually(lambda: name not in debug_rpc_binding_keys(vhost), timeout=3 * HANG)
        with pytest.raises(NoServer):
            await client.call(name, timeout=30)
    finally:
        code, _, _ = await snooper.stop()
    assert code == 0
