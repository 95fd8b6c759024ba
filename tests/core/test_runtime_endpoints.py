"""Endpoints added to and removed from a running unit (RQ consume / cancel queue at run time)."""

from __future__ import annotations

import asyncio

import pytest

from qbroker import CallTimeout, NoServer, TimedOutInQueue
from tests.conftest import MakeUnit

HANG = 60.0


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
