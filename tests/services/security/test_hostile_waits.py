"""A client account that parks render requests (docs/security.md, "Attacks and answers": parked render requests): what
one account holds never gets another refused, and a request without a deadline does not wait for ever.
The queuemaster runs in-process with its own account and its default caps; no renderer runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import orjson
import pytest

from harness import HANG, eventually
from qbroker import RequestError, Unit
from services.tiles.queuemaster.service import QueuemasterService
from services.tiles.queuemaster.settings import MAX_WAITS_PER_ACCOUNT
from services.tiles.queuemaster.state_machine import Queuemaster, QueuemasterSettings

QM = "toposm.queuemaster"


@pytest.fixture
async def queuemaster(as_role, tmp_path) -> AsyncIterator[Queuemaster]:
    settings = QueuemasterSettings(tile_root=tmp_path / "tiles", state_file=tmp_path / "q.sqlite", default_deadline=1.0)
    qm = Queuemaster(settings)
    unit = await as_role("queuemaster", app=QM, start=False)
    service = QueuemasterService(unit, qm)
    await unit.start()
    await service.start()
    try:
        yield qm
    finally:
        with contextlib.suppress(Exception):
            await service.stop()
        qm.close()


async def waiting(unit: Unit) -> int:
    return int((await unit.call(QM, {"command": "stats"}, timeout=HANG))["waiting_requests"])


async def test_one_accounts_parked_renders_never_get_another_account_refused(queuemaster, as_role) -> None:
    """The client parks as many renders of one metatile as an account may (the issue's attack: 100,000
    of them took the queuemaster to 1 GB and had every other account answered `busy`); its next one is
    `busy`, while another account's render is taken and waits as any other."""
    client = await as_role("client")
    parked = [
        asyncio.create_task(client.call(QM, {"command": "render", "tile": "18/0/0"}, timeout=10 * HANG))
        for _ in range(MAX_WAITS_PER_ACCOUNT)
    ]
    await eventually(lambda: _equals(waiting(client), MAX_WAITS_PER_ACCOUNT))
    with pytest.raises(RequestError) as info:
        await client.call(QM, {"command": "render", "tile": "18/8/8"}, timeout=HANG)
    assert info.value.id == "busy" and "per account" in str(info.value.detail)
    web = await as_role("web")
    other = asyncio.create_task(web.call(QM, {"command": "render", "tile": "18/16/16"}, timeout=10 * HANG))
    await eventually(lambda: _equals(waiting(web), MAX_WAITS_PER_ACCOUNT + 1))
    assert not other.done()  # taken: it waits for its metatile like any request
    assert queuemaster.stats.counters["requests_refused_account"] == 1
    for task in (*parked, other):
        task.cancel()
    await asyncio.gather(*parked, other, return_exceptions=True)


async def test_a_render_without_a_deadline_ends_at_the_default_deadline(queuemaster, provisioned) -> None:
    """On the seed's osm wire a request carries no deadline: it is answered `render_timeout` at the
    queuemaster's default deadline (here 1 s) instead of waiting for ever."""
    connection = await aio_pika.connect(provisioned.url_with_password("client"), timeout=HANG)
    try:
        channel = await connection.channel()
        replies = await channel.declare_queue(exclusive=True)
        osm = await channel.get_exchange("osm", ensure=False)
        answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await answers.put(orjson.loads(message.body))

        await replies.consume(on_reply, no_ack=True)
        body = {"command": "render", "tile": "18/0/0"}
        await osm.publish(
            aio_pika.Message(orjson.dumps(body), reply_to=replies.name, user_id=provisioned.names["client"]),
            routing_key=QM,
        )
        answer = await asyncio.wait_for(answers.get(), HANG)
        assert answer["status"] == "error" and answer["error"] == "render_timeout", answer
        assert queuemaster.waiting == 0
    finally:
        await connection.close()


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
