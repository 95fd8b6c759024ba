"""Crashes: a renderer SIGKILLed mid-render, a queuemaster SIGKILLed with work queued."""

import asyncio
import json
import time

import aio_pika

from harness import eventually

from .conftest import render_in_progress, stats, wait_renderers


async def _slow_render_then_second_renderer(bus, tile):
    """A queuemaster, a renderer stuck mid-render on ``tile``'s metatile, and a second, fast renderer."""
    bus.queuemaster()
    slow = bus.renderer("--render-delay", "60", "--drain-timeout", "0")
    client = await bus.client()
    await wait_renderers(client, 1)
    request = await render_in_progress(client, tile, timeout=40)
    fast = bus.renderer()
    await wait_renderers(client, 2)
    return client, slow, fast, request


async def test_renderer_sigkill_mid_render_is_redispatched(bus):
    client, slow, fast, request = await _slow_render_then_second_renderer(bus, "13/100/100")
    killed = time.monotonic()
    slow.kill()  # SIGKILL: no unregister, its exclusive queues vanish with its connection
    reply = await request  # the liveness ping's NoServer puts the metatile back for the fast renderer
    # A figure for docs/reliability.md (bench/chaos.py renderer), not an assertion.
    print(f"\nRENDERER-SIGKILL: waiter answered {time.monotonic() - killed:.2f}s after SIGKILL")
    assert reply["command"] == "rendered" and reply["metatile"] == "13/12/12"
    s = await stats(client)
    assert s["counters"]["renderers_lost"] == 1 and s["counters"]["requeued"] == 1
    assert [r["pid"] for r in s["renderers"]] == [fast.pid]
    [line] = bus.render_log_lines()
    assert f".{fast.pid}." in line["renderer"]


async def test_queuemaster_sigkill_and_restart_loses_nothing(bus):
    qm = bus.queuemaster("--render-missing-expired")
    bus.renderer("--render-delay", "0.4")
    client = await bus.client()
    await wait_renderers(client, 1)
    expired = [f"11/{x * 8}/{y * 8}" for x in range(5) for y in range(4)]  # 20 distinct metatiles
    await client.call("toposm.queuemaster", {"command": "expire", "tiles": ";".join(expired)})

    async def some_rendered():
        return len(bus.render_log_lines()) >= 2

    await eventually(some_rendered)
    qm.kill()
    bus.queuemaster("--render-missing-expired")
    # the renderer hears "queuemaster online" and registers again
    await wait_renderers(client, 1)
    s = await stats(client)
    done = {line["metatile"] for line in await asyncio.to_thread(bus.render_log_lines)}  # read after stats
    # every metatile is rendered, queued or being rendered: nothing lost
    assert s["queues"]["total"] + s["queues"]["rendering"] + len(done) >= 20

    async def all_rendered():
        return {line["metatile"] for line in bus.render_log_lines()} >= {
            f"11/{x}/{y}" for x in range(5) for y in range(4)
        } or None

    await eventually(all_rendered, timeout=40)
    s = await stats(client)
    assert s["queues"]["total"] == 0 and s["queues"]["rendering"] == 0


async def test_renderer_sigterm_unregisters_and_puts_work_back(bus):
    client, slow, fast, request = await _slow_render_then_second_renderer(bus, "12/7/7")
    slow.popen.terminate()  # graceful: the renderer sends `unregister` before it exits
    assert (await request)["metatile"] == "12/0/0"
    s = await stats(client)
    assert s["counters"].get("renderers_lost", 0) == 0 and s["counters"]["requeued"] == 1
    assert [r["pid"] for r in s["renderers"]] == [fast.pid]


async def test_renderer_sigterm_finishes_the_metatile_in_hand(bus):
    bus.queuemaster()
    renderer = bus.renderer("--render-delay", "3", "--drain-timeout", "60")
    client = await bus.client()
    await wait_renderers(client, 1)
    request = await render_in_progress(client, "9/9/9")
    renderer.popen.terminate()  # graceful: the drain timeout leaves time to finish the render
    assert (await request)["metatile"] == "9/1/1"
    assert await asyncio.to_thread(renderer.popen.wait, 30) == 0
    [line] = bus.render_log_lines()
    assert line["status"] == "ok" and f".{renderer.pid}." in line["renderer"]
    s = await stats(client)
    assert s["renderers"] == [] and "requeued" not in s["counters"]


async def test_status_and_shutdown_alerts(bus):
    bus.queuemaster()
    renderer = bus.renderer("--operator-users", "guest", threads=2)  # the test's account may shut it down
    client = await bus.client()
    await wait_renderers(client, 2)
    # one process answers a status alert on the level above its threads once, for both threads
    replies = [r.body async for r in client.gather("toposm.render", {"command": "status"}, timeout=10, max_replies=1)]
    [status] = replies
    assert status["pid"] == renderer.pid and [t["threadid"] for t in status["threads"]] == [0, 1]
    assert {t["state"] for t in status["threads"]} == {"idle"}
    # `shutdown` takes the same path as SIGTERM: unregister, then exit cleanly
    [ack] = [
        r.body
        async for r in client.gather(
            f"toposm.render.{status['hostname']}.{renderer.pid}", {"command": "shutdown"}, timeout=10, max_replies=1
        )
    ]
    assert ack == {"command": "shutting down", "pid": renderer.pid}
    assert await asyncio.to_thread(renderer.popen.wait, 30) == 0
    s = await stats(client)
    assert s["renderers"] == [] and "renderers_lost" not in s["counters"]


async def test_render_waiter_ends_with_its_callers_deadline(bus):
    """No renderer: the `render` waiter ends at the request's own deadline instead of staying forever."""
    from qbroker import QBrokerError

    bus.queuemaster()
    client = await bus.client()
    await eventually(lambda: stats(client))  # up
    try:
        await client.call("toposm.queuemaster", {"command": "render", "tile": "10/5/5"}, timeout=1)
    except QBrokerError as exc:  # render_timeout from the queuemaster, or our own call_timeout: a race
        assert exc.id in ("render_timeout", "call_timeout")

    async def no_waiters():
        return (await stats(client))["waiting_requests"] == 0

    await eventually(no_waiters)


async def test_queuemaster_sigkill_answers_its_waiting_requesters_after_restart(bus):
    """`render` requests are acked at once (they may wait minutes): their reply-to and message-id are
    kept with the queue, so the restarted queuemaster answers requesters the killed one left waiting."""
    qm = bus.queuemaster()
    client = await bus.client()
    await eventually(lambda: stats(client))
    tiles = ["10/100/100", "10/200/200", "10/300/300"]
    calls = [
        asyncio.create_task(client.call("toposm.queuemaster", {"command": "render", "tile": t}, timeout=120))
        for t in tiles
    ]

    async def all_waiting():
        return (await stats(client))["waiting_requests"] == len(tiles)

    await eventually(all_waiting)  # no renderer yet: all three wait
    qm.kill()
    bus.queuemaster()
    bus.renderer()
    replies = await asyncio.wait_for(asyncio.gather(*calls), 120)
    assert [(r["command"], r["tile"]) for r in replies] == [("rendered", t) for t in tiles]


async def test_queuemaster_sigkill_with_10000_queued_and_50_requesters(bus):
    """The case docs/reliability.md quotes: 10,000 metatiles queued and 50 requesters waiting when the
    queuemaster is SIGKILLed; after the restart nothing is lost and every requester is answered."""
    qm = bus.queuemaster("--render-missing-expired")
    client = await bus.client()
    await eventually(lambda: stats(client))
    expired = ";".join(f"13/{x * 8}/{y * 8}" for x in range(100) for y in range(100))
    await client.call("toposm.queuemaster", {"command": "expire", "tiles": expired}, timeout=120)
    tiles = [f"12/{i * 8}/8" for i in range(50)]
    calls = [
        asyncio.create_task(client.call("toposm.queuemaster", {"command": "render", "tile": t}, timeout=600))
        for t in tiles
    ]

    async def all_waiting():
        s = await stats(client)
        return s if s["waiting_requests"] == len(tiles) else None

    before = (await eventually(all_waiting, timeout=60))["queues"]["total"]
    assert before == 10_000 + 50
    qm.kill()
    restarted = time.monotonic()
    bus.queuemaster("--render-missing-expired")

    async def restored():
        s = await stats(client)
        return s if s["waiting_requests"] == len(tiles) else None

    after = (await eventually(restored, timeout=60))["queues"]["total"]
    assert after == before  # nothing lost
    bus.renderer(threads=2)
    replies = await asyncio.wait_for(asyncio.gather(*calls), 600)
    assert sorted(r["tile"] for r in replies) == sorted(tiles)
    print(
        f"\nQM-SIGKILL: {before} queued and {len(tiles)} waiting at SIGKILL; {after} queued after restart; "
        f"all {len(replies)} requesters answered {time.monotonic() - restarted:.1f}s after the restart"
    )


async def test_queuemaster_sigkill_answers_seed_wire_requesters_after_restart(bus):
    """The same for `render` asked on the seed's raw `osm` wire: answered there, as raw JSON, after the restart."""
    from .seed_programs import osm_client, osm_wire_ready

    qm = bus.queuemaster()
    client = await bus.client()
    await eventually(lambda: stats(client))
    connection, exchange, replies = await osm_client(bus.url)
    try:
        await osm_wire_ready(connection)
        tiles = {"c1": "11/100/100", "c2": "11/900/900"}
        for correlation_id, tile in tiles.items():
            await exchange.publish(
                aio_pika.Message(
                    json.dumps({"command": "render", "tile": tile}).encode(),
                    reply_to=replies.name,
                    correlation_id=correlation_id,
                ),
                routing_key="toposm.queuemaster",
            )

        async def all_waiting():
            return (await stats(client))["waiting_requests"] == len(tiles)

        await eventually(all_waiting)  # no renderer yet: both wait
        qm.kill()
        bus.queuemaster()
        bus.renderer()
        answered = {}
        async with replies.iterator(timeout=120) as messages:
            async for message in messages:
                async with message.process():
                    answered[message.correlation_id] = json.loads(message.body)
                if len(answered) == len(tiles):
                    break
        assert {c: (a["command"], a["tile"]) for c, a in answered.items()} == {
            c: ("rendered", t) for c, t in tiles.items()
        }
    finally:
        await connection.close()
