"""A hostile client against the TopOSM services: every attack docs/security.md lists is tried with
the client's (or another renderer's) own account and must be answered ``fail``/``forbidden`` or refused by
the broker, never obeyed. The queuemaster and a renderer run in-process with their own accounts."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aio_pika
import orjson
import pytest

from harness import HANG, eventually
from qbroker import RequestFailed, Unit
from services.tiles.queuemaster.access import AccessPolicy
from services.tiles.queuemaster.service import QueuemasterService
from services.tiles.queuemaster.state_machine import Queuemaster, QueuemasterSettings
from services.tiles.renderer.process import RendererProcess
from services.tiles.renderer.settings import RendererSettings
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Tile

QM = "toposm.queuemaster"


@dataclass
class Stack:
    qm: Queuemaster
    renderer: RendererProcess
    stop_asked: asyncio.Event
    tile_root: object


@pytest.fixture
async def stack(provisioned, as_role, tmp_path) -> AsyncIterator[Stack]:
    names = provisioned.names
    settings = QueuemasterSettings(
        tile_root=tmp_path / "tiles",
        state_file=tmp_path / "q.sqlite",
        ping_interval=0.5,
        access=AccessPolicy(
            renderers=frozenset({names["renderer"], names["renderer2"]}),
            expirers=frozenset({names["spark_bridge"], names["operator"]}),
        ),
    )
    qm = Queuemaster(settings)
    qm_unit = await as_role("queuemaster", app=QM, start=False)
    service = QueuemasterService(qm_unit, qm)
    await qm_unit.start()
    await service.start()
    stop_asked = asyncio.Event()
    r_unit = await as_role("renderer", app="toposm.renderer", start=False)
    renderer = RendererProcess(
        r_unit,
        RendererSettings(
            tile_root=tmp_path / "tiles",
            hostname="vader",
            render_delay=4.0,
            operator_users=frozenset({names["operator"]}),
            queuemaster_users=frozenset({names["queuemaster"]}),
        ),
        request_stop=stop_asked.set,
    )
    await r_unit.start()
    await renderer.start()
    try:
        yield Stack(qm, renderer, stop_asked, tmp_path / "tiles")
    finally:
        with contextlib.suppress(Exception):
            await renderer.stop()
        with contextlib.suppress(Exception):
            await service.stop()
        qm.close()


async def forbidden(unit: Unit, body: dict) -> RequestFailed:
    with pytest.raises(RequestFailed) as info:
        await unit.call(QM, body, timeout=HANG)
    assert info.value.id == "forbidden" and info.value.status == "fail", info.value
    return info.value


async def registered(client: Unit) -> list[dict]:
    stats = await client.call(QM, {"command": "stats"}, timeout=HANG)
    return list(stats["renderers"])


async def test_forged_renderer_commands_are_forbidden(stack, as_role) -> None:
    client = await as_role("client")
    other = await as_role("renderer2")  # a legitimate renderer account, but not the one rendering
    [thread] = await eventually(lambda: registered(client))
    assert thread["hostname"] == "vader"
    pid = os.getpid()
    ids = {"hostname": "vader", "pid": pid, "threadid": 0}
    # a waiter on a never-rendered metatile; the only render thread takes it (4 s render)
    request = asyncio.create_task(client.call(QM, {"command": "render", "tile": "12/1000/1500"}, timeout=HANG))
    await eventually(lambda: _rendering(client))
    # "rendered" though no tile exists: from a client, and from another renderer account with the right ids
    await forbidden(client, {"command": "rendered", "metatile": "12/125/187", **ids})
    await forbidden(other, {"command": "rendered", "metatile": "12/125/187", **ids})
    # the rendering thread's own account, but not the thread the metatile was dispatched to
    same_account = await as_role("renderer", app="test.same.account")
    await forbidden(same_account, {"command": "rendered", "metatile": "12/125/187", **ids, "threadid": 5})
    await forbidden(same_account, {"command": "rendered", "metatile": "12/0/0", **ids})  # not dispatched
    # unregister thread 0 "on every host", and a fake renderer taking over the real thread's name
    await forbidden(client, {"command": "unregister", "threadid": 0})
    await forbidden(other, {"command": "unregister", "threadid": 0})
    await forbidden(client, {"command": "register", "hostname": "evil", "pid": 1, "threadid": 0})
    await forbidden(other, {"command": "register", **ids})
    # `render` to the hierarchy's levels (reaching any idle thread): the broker lets a renderer account
    # publish there (it re-publishes redelivered requests), the renderers refuse it from anyone but the
    # queuemaster's account
    for level in ("toposm.render", "toposm.render.vader", f"toposm.render.vader.{pid}"):
        with pytest.raises(RequestFailed) as info:
            await other.call(level, {"command": "render", "metatile": "12/0/0"}, timeout=HANG)
        assert info.value.id == "forbidden", (level, info.value)
    # expire is for the Spark bridge and operators in this deployment
    await forbidden(client, {"command": "expire", "tiles": "12/1000/1500"})
    # none of that was obeyed: the answer comes only when the real render has written its tiles
    reply = await request
    assert reply["command"] == "rendered" and reply["metatile"] == "12/125/187"
    assert all(TileStore(stack.tile_root).tile_exists(t) for t in Tile(12, 1000, 1500).metatile.tiles())
    [thread] = await registered(client)
    assert thread["renderer"] == f"toposm.render.vader.{pid}.0" and thread["rendered"] == 1
    # a legitimate registration by the second renderer account of its own thread works
    ok = await other.call(QM, {"command": "register", "hostname": "luke", "pid": 7, "threadid": 0}, timeout=HANG)
    assert ok["command"] == "registered"
    done = await other.call(QM, {"command": "unregister", "hostname": "luke", "pid": 7}, timeout=HANG)
    assert done["renderers"] == ["toposm.render.luke.7.0"]
    operator = await as_role("operator")  # the Spark bridge expires by alert (expire_toposm), not by command
    expired = await operator.call(QM, {"command": "expire", "tiles": "12/1000/1500"}, timeout=HANG)
    assert expired["command"] == "expired"


async def _rendering(client: Unit) -> bool:
    threads = await registered(client)
    return bool(threads) and threads[0]["state"] == "rendering"


async def test_seed_wire_renderer_commands_need_a_renderer_account(stack, provisioned) -> None:
    """The literal osm exchange: a client's `rendered`/`unregister` there is answered forbidden too."""
    connection = await aio_pika.connect(provisioned.url_with_password("client"), timeout=HANG)
    try:
        channel = await connection.channel()
        replies = await channel.declare_queue(exclusive=True)
        osm = await channel.get_exchange("osm", ensure=False)
        answers: asyncio.Queue[dict] = asyncio.Queue()

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await answers.put(orjson.loads(message.body))

        await replies.consume(on_reply, no_ack=True)
        for body in (
            {"command": "rendered", "metatile": "12/125/187"},
            {"command": "unregister", "threadid": 0},
            {"command": "register", "hostname": "evil", "pid": 1, "threadid": 0},
        ):
            await osm.publish(
                aio_pika.Message(orjson.dumps(body), reply_to=replies.name, user_id=provisioned.names["client"]),
                routing_key=QM,
            )
            answer = await asyncio.wait_for(answers.get(), HANG)
            assert answer["status"] == "fail" and answer["error"] == "forbidden", answer
        # and without any user_id at all (a seed client that never sets it)
        await osm.publish(
            aio_pika.Message(orjson.dumps({"command": "unregister"}), reply_to=replies.name), routing_key=QM
        )
        answer = await asyncio.wait_for(answers.get(), HANG)
        assert answer["error"] == "forbidden"
        stats = {"command": "stats"}
        await osm.publish(aio_pika.Message(orjson.dumps(stats), reply_to=replies.name), routing_key=QM)
        assert (await asyncio.wait_for(answers.get(), HANG))["command"] == "stats"  # allowed to everyone
    finally:
        await connection.close()


async def test_shutdown_only_from_an_operator(stack, as_role) -> None:
    renderer_name = stack.renderer.threads[0].endpoint
    process_level = renderer_name.rsplit(".", 1)[0]
    client = await as_role("client")
    # the broker refuses the client's control alert outright (topic permission on `alert`)
    with pytest.raises(RequestFailed, match="ACCESS_REFUSED") as refused:
        await client.alert(process_level, {"command": "shutdown"})
    assert refused.value.id == "forbidden"
    # the queuemaster's account may publish on `toposm` (its "online" announcement), not shut down renderers
    qm_like = await as_role("queuemaster", app="test.qm.account")
    [reply] = [r async for r in qm_like.gather("toposm", {"command": "shutdown"}, timeout=HANG, max_replies=1)]
    assert reply.error is not None and reply.error.id == "forbidden"
    assert not stack.stop_asked.is_set() and not stack.renderer.stopping.is_set()
    # the operator may
    operator = await as_role("operator")
    [reply] = [r async for r in operator.gather(process_level, {"command": "shutdown"}, timeout=HANG, max_replies=1)]
    assert reply.body == {"command": "shutting down", "pid": os.getpid()}
    await asyncio.wait_for(stack.stop_asked.wait(), HANG)


async def test_renderer_asked_to_stop_finishes_its_metatile(stack, as_role) -> None:
    """A stop request during a render: the metatile in hand is finished (within the drain grace) and
    reported, not abandoned."""
    client = await as_role("client")
    await eventually(lambda: registered(client))
    request = asyncio.create_task(client.call(QM, {"command": "render", "tile": "11/9/9"}, timeout=HANG))
    await eventually(lambda: _rendering(client))
    await stack.renderer.stop()  # what SIGTERM (or an operator's shutdown) leads to
    reply = await request
    assert reply["metatile"] == "11/1/1"
    assert all(TileStore(stack.tile_root).tile_exists(t) for t in Tile(11, 9, 9).metatile.tiles())
    assert await registered(client) == []  # unregistered after finishing
