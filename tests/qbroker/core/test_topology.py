"""Broker behaviour qbroker relies on, checked on both brokers so the memory one stays faithful:
redelivery after a crash, declare conflicts, exclusive endpoints vanishing with their unit."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from harness import HANG, eventually
from qbroker import NoServer, RequestContext
from qbroker.errors import TopologyConflict
from tests.conftest import MakeUnit


def _name(prefix: str) -> str:
    # The RabbitMQ run shares one vhost across tests: durable queues must not collide.
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


async def test_killed_server_request_is_redelivered_to_another(make_unit: MakeUnit) -> None:
    name = _name("t.redeliver")
    seen: list[tuple[str, object]] = []
    hold = asyncio.Event()
    servers = []
    for label in ("first", "second"):
        server = await make_unit(f"test.{label}")

        @server.rpc(name, prefetch=1)
        async def handle(ctx: RequestContext, label: str = label) -> str:
            assert ctx.message is not None
            # A redelivered request is re-queued once with its failure count (poison-loop guard).
            seen.append((label, ctx.headers.get("x-qbroker-failures")))
            if label == "first":
                await hold.wait()
            return label

        servers.append(server)
    await servers[0].start()
    client = await make_unit("test.client")
    await client.start()
    call = asyncio.create_task(client.call(name, {}, timeout=10))
    await eventually(lambda: seen == [("first", None)])
    await servers[1].start()
    await servers[0].kill()  # dies mid-request: the unacked request goes back to the queue
    assert await call == "second"
    assert seen == [("first", None), ("second", 1)]


async def test_conflicting_endpoint_options_fail_start(make_unit: MakeUnit) -> None:
    name = _name("t.conflict")
    plain = await make_unit("test.plain")

    @plain.rpc(name)
    async def one() -> int:
        return 1

    await plain.start()
    prioritised = await make_unit("test.prioritised")

    @prioritised.rpc(name, max_priority=5)
    async def two() -> int:
        return 2

    with pytest.raises(TopologyConflict, match="x-max-priority is none there, qbroker declares 5"):
        await prioritised.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call(name) == 1  # the existing server is unaffected


async def test_exclusive_endpoint_vanishes_with_its_unit(make_unit: MakeUnit) -> None:
    name = _name("t.instance")
    server = await make_unit("test.instance")

    @server.rpc(name, exclusive=True)
    async def mine() -> str:
        return server.uuid

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call(name) == server.uuid
    await server.kill()
    # NoServer is the dead-letter path's answer; our own deadline would raise CallTimeout instead.
    with pytest.raises(NoServer):
        await client.call(name, timeout=30)


async def test_units_start_beside_a_dead_kept_queue_with_other_bounds(make_unit: MakeUnit) -> None:
    """``dead.kept`` declared with other bounds (an older qbroker had no byte bound; another unit may be
    configured otherwise) is used as it is: a re-declare with other arguments would fail every unit's start."""
    earlier = await make_unit("test.earlier", dead_kept_max_bytes=1000)
    await earlier.start()
    later = await make_unit("test.later")
    await asyncio.wait_for(later.start(), HANG)
    with pytest.raises(NoServer):  # the bus works: a call to nobody is answered by a collector
        await later.call("t.nobody", timeout=HANG)
