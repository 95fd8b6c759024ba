"""Retries counted on the message (EventMQ retry-count, RQ RETRIES): parked in the broker during the backoff,
taken by any server of the name, and the final error answered and recorded in ``dead``."""

from __future__ import annotations

import asyncio

import pytest

from harness import HANG
from qbroker import RequestContext, RequestError
from qbroker.request_middleware import RETRIES
from tests.conftest import MakeUnit
from tests.qbroker.core.waits import queue_exists, ready_messages


async def test_a_retry_carries_its_count_and_the_last_error_is_answered(make_unit: MakeUnit, transport: str) -> None:
    seen: list[int] = []
    server = await make_unit("test.server")

    @server.rpc("t.flaky", retries=2)
    async def flaky(fail: int, ctx: RequestContext) -> str:
        seen.append(int(ctx.headers.get(RETRIES, 0)))
        if len(seen) <= fail:
            raise RequestError("db_down", "database unavailable")
        return "ok"

    client = await make_unit("test.client")
    await server.start()
    await client.start()
    assert await client.call("t.flaky", {"fail": 2}, timeout=HANG) == "ok"
    assert seen == [0, 1, 2]  # the count came back on the message each time

    seen.clear()
    with pytest.raises(RequestError) as final:
        await client.call("t.flaky", {"fail": 99}, timeout=HANG)
    assert final.value.id == "db_down" and seen == [0, 1, 2]  # 1 try + 2 retries, then the error


async def test_a_retry_survives_the_death_of_the_server_that_failed(make_unit: MakeUnit, transport: str) -> None:
    first, second = await make_unit("test.first"), await make_unit("test.second")
    failed = asyncio.Event()
    served_by: list[str] = []

    # The first server gets the request while it can take it (consumer priority); its retries wait 4 s,
    # 8 s, 16 s in the broker: time enough to see one of them parked and kill the server (on a loaded
    # machine a poll can take seconds, so any of the three parked queues will do).
    @first.rpc("t.job", retries=3, priority=10, retry_delay=4.0)
    async def doomed(ctx: RequestContext) -> str:
        failed.set()
        raise RequestError("disk_full", "no space left")

    @second.rpc("t.job", retries=3, retry_delay=4.0)
    async def healthy(ctx: RequestContext) -> str:
        served_by.append(str(ctx.headers.get(RETRIES)))
        return "done"

    client = await make_unit("test.client")
    for unit in (first, second, client):
        await unit.start()
    call = asyncio.create_task(client.call("t.job", {}, timeout=2 * HANG))
    await asyncio.wait_for(failed.wait(), HANG)
    parked = [f"{client.config.exchange_prefix}qbroker.retry.t.job.{ms}" for ms in (4000, 8000, 16000)]

    async def retry_parked() -> None:
        while True:
            for queue in parked:
                if await queue_exists(client, queue) and await ready_messages(client, queue) == 1:
                    return
            await asyncio.sleep(0.02)

    await asyncio.wait_for(retry_parked(), HANG)
    await first.kill()  # the retry is parked in the broker, not in the dead server's memory
    assert await call == "done"
    assert served_by and int(served_by[0]) >= 1  # it came back as a retry, with its count
