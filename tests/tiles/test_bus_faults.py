"""Crashes: a renderer SIGKILLed mid-render, a queuemaster SIGKILLed with work queued."""

import asyncio
import time

from .conftest import eventually, stats, wait_renderers


async def _slow_render_then_second_renderer(bus, tile):
    """A queuemaster, a renderer stuck mid-render on ``tile``'s metatile, and a second, fast renderer."""
    bus.queuemaster()
    slow = bus.renderer("--render-delay", "60")
    client = await bus.client()
    await wait_renderers(client, 1)
    body = {"command": "render", "tile": tile}
    request = asyncio.create_task(client.call("toposm.queuemaster", body, timeout=40))

    async def slow_has_it():
        s = await stats(client)
        return s["renderers"][0]["state"] == "rendering"

    await eventually(slow_has_it)
    fast = bus.renderer()
    await wait_renderers(client, 2)
    return client, slow, fast, request


async def test_renderer_sigkill_mid_render_is_redispatched(bus):
    client, slow, fast, request = await _slow_render_then_second_renderer(bus, "13/100/100")
    slow.kill()  # SIGKILL: no unregister, its exclusive queues vanish with its connection
    killed_at = time.monotonic()
    reply = await request
    detected_in = time.monotonic() - killed_at
    assert reply["command"] == "rendered" and reply["metatile"] == "13/12/12"
    print(f"answered {detected_in:.2f}s after the SIGKILL")
    assert detected_in < 8, detected_in
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
    before = await asyncio.to_thread(bus.render_log_lines)
    await asyncio.sleep(0.5)
    bus.queuemaster("--render-missing-expired")
    # the renderer hears "queuemaster online" and registers again
    await wait_renderers(client, 1)
    s = await stats(client)
    done_before = {line["metatile"] for line in before}
    # every metatile is either rendered, queued or being rendered: nothing lost
    assert s["queues"]["total"] + s["queues"]["rendering"] + len(done_before) >= 20

    async def all_rendered():
        return {line["metatile"] for line in bus.render_log_lines()} >= {
            f"11/{x}/{y}" for x in range(5) for y in range(4)} or None

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
