"""Endpoints added to and removed from a running unit (RQ consume / cancel queue at run time)."""

from __future__ import annotations

import asyncio
from dataclasses import fields

import pytest

from harness import HANG
from qbroker import CallTimeout, NoServer, RequestFailed, TimedOutInQueue
from qbroker.endpoints import EndpointOptions, EndpointSettings
from tests.conftest import MakeUnit


async def _endpoints_seen(client: object, uuid: str) -> list[str]:
    """What ``qbroker list`` shows of the unit: its answer to ``qbroker.ping``."""
    async for reply in client.gather("qbroker.ping", timeout=2, gap=0.5):  # type: ignore[attr-defined]
        if reply.body["uuid"] == uuid:
            return sorted(reply.body["endpoints"])
    raise AssertionError("the unit did not answer qbroker.ping")


async def test_add_and_remove_an_endpoint_while_running(make_unit: MakeUnit, transport: str) -> None:
    server = await make_unit("test.runtime", rpc_queue_expiry=0.3)
    client = await make_unit("test.client", rpc_queue_expiry=0.3)
    await server.start()
    await client.start()
    assert await _endpoints_seen(client, server.uuid) == []

    async def late(text: str) -> str:
        return text.upper()

    await server.add_rpc("test.late", late, prefetch=4)
    assert await client.call("test.late", {"text": "hi"}, timeout=HANG) == "HI"
    assert await _endpoints_seen(client, server.uuid) == ["test.late"]
    with pytest.raises(ValueError, match="already registered"):
        await server.add_rpc("test.late", late)

    await server.remove_endpoint("test.late")
    assert await _endpoints_seen(client, server.uuid) == []
    # Nobody serves it now: once the grace is over its queue is gone and callers hear no_server.
    deadline = asyncio.get_running_loop().time() + HANG
    while True:
        try:
            await client.call("test.late", {"text": "again"}, timeout=1)
        except NoServer:
            break
        except (CallTimeout, TimedOutInQueue):
            pass  # still within the grace: the request waited in the queue
        else:
            raise AssertionError("a removed endpoint answered")
        assert asyncio.get_running_loop().time() < deadline, "never answered no_server"
    with pytest.raises(ValueError, match="no endpoint"):
        await server.remove_endpoint("test.late")


async def test_broadcast_reaches_every_server_of_a_name(make_unit: MakeUnit, transport: str) -> None:
    servers = [await make_unit(f"test.server{i}") for i in range(3)]
    client = await make_unit("test.client")
    for i, server in enumerate(servers):

        async def who(i: int = i) -> int:
            return i

        server.rpc("test.census")(who)
        await server.start()
    await client.start()
    # Load-balanced as ever: one call, one server.
    assert await client.call("test.census", {}, timeout=HANG) in (0, 1, 2)
    # Broadcast: every server answers once.
    answers = [r.body async for r in client.broadcast("test.census", {}, timeout=HANG, max_replies=3)]
    assert sorted(answers) == [0, 1, 2]

    async def late() -> int:
        return 9

    await servers[0].add_rpc("test.late", late)
    assert [r.body async for r in client.broadcast("test.late", timeout=HANG, max_replies=1)] == [9]
    await servers[0].remove_endpoint("test.census")
    assert "qbroker.broadcast.test.census" not in servers[0].describe()["listeners"]
    answers = [r.body async for r in client.broadcast("test.census", {}, timeout=HANG, max_replies=2)]
    assert sorted(answers) == [1, 2]
    # Bad input reaches each server and comes back as each one's fail reply, not an exception.
    replies = [r async for r in client.broadcast("test.census", {"x": 1}, timeout=HANG, max_replies=2)]
    assert [r.error.id for r in replies if r.error] == ["invalid_params", "invalid_params"]


async def test_endpoint_options_are_the_same_for_every_way_to_serve(make_unit: MakeUnit, transport: str) -> None:
    """``rpc``, ``commands`` and ``add_rpc`` take the one ``EndpointOptions`` (as ``EndpointSettings``
    keywords): an option is written once, and one added at run time works as one registered up front."""
    assert EndpointSettings.__annotations__.keys() == {f.name for f in fields(EndpointOptions)}
    server = await make_unit("test.runtime")
    with pytest.raises(ValueError, match="prefetch"):
        server.commands("test.none", prefetch=0)
    await server.start()
    client = await make_unit("test.client")
    await client.start()

    async def small(text: str) -> int:
        return len(text)

    await server.add_rpc("test.small", small, max_body_bytes=1024)
    assert server.endpoints["test.small"].options == EndpointOptions(max_body_bytes=1024)
    with pytest.raises(RequestFailed, match="exceeds the limit of 1024") as info:
        await client.call("test.small", {"text": "z" * 2048}, timeout=HANG)
    assert info.value.id == "too_large"
    assert await client.call("test.small", {"text": "ok"}, timeout=HANG) == 2
