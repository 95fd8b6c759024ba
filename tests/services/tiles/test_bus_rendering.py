"""Queuemaster and renderers as subprocesses on real RabbitMQ: the normal rendering sequence."""

import asyncio
import json
import subprocess

import pytest
from PIL import Image

from harness import eventually
from qbroker import InvalidParams, NoServer, RequestError, RequestFailed, UnknownCommand
from services.tiles.renderer.worker import render_metatile
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Tile

from .conftest import BIN, render_in_progress, stats, wait_renderers


async def test_register_render_rendered(bus):
    bus.queuemaster()
    bus.renderer("--strategy", "missing:2,by_work_available:6", threads=2)
    client = await bus.client()
    s = await wait_renderers(client, 2)
    assert {r["strategy"] for r in s["renderers"]} == {"missing:2,by_work_available:6"}
    assert all(r["renderer"].startswith("toposm.render.") and r["state"] == "idle" for r in s["renderers"])

    # five requesters wait on one never-rendered metatile: one render answers all of them
    tiles = ["12/1000/1500", "12/1001/1500", "12/1007/1503", "12/1003/1501", "12/1000/1500"]
    replies = await asyncio.gather(
        *(client.call("toposm.queuemaster", {"command": "render", "tile": t}, timeout=20) for t in tiles)
    )
    assert [r["tile"] for r in replies] == tiles
    assert {(r["command"], r["metatile"]) for r in replies} == {("rendered", "12/125/187")}
    store = TileStore(bus.tile_root)
    assert all(store.tile_exists(t) for t in Tile(12, 1000, 1500).metatile.tiles())
    assert Image.open(store.path(Tile(12, 1003, 1501))).size == (256, 256)

    [line] = bus.render_log_lines()
    assert line["metatile"] == "12/125/187" and line["zoom"] == 12 and line["status"] == "ok"
    assert line["renderer"].startswith("toposm.render.") and line["duration"] > 0 and line["start"] > 0

    # fresh: answered at once, nothing rendered again
    again = await client.call("toposm.queuemaster", {"command": "render", "tile": "12/1002/1502"}, timeout=5)
    assert again["metatile"] == "12/125/187"
    s = await stats(client)
    assert s["counters"]["rendered"] == 1 and s["counters"]["requested"] == 6
    assert s["render_time"]["12"]["count"] == 1
    assert len(bus.render_log_lines()) == 1


async def test_strategy_by_zoom_prefers_high_zoom(bus):
    """by_zoom weights zooms 4^z: with z5 and z6 queued, about 80% of early picks are z6."""
    bus.queuemaster("--render-missing-expired", "--seed", "42")
    client = await bus.client()
    await eventually(lambda: stats(client))
    z5 = [f"5/{x * 8}/{y * 8}" for x in range(4) for y in range(4)]  # all 16 metatiles of z5
    z6 = [f"6/{x * 8}/{y * 8}" for x in range(4) for y in range(4)]  # 16 of z6's 64
    await client.alert("expire_toposm", ";".join(z5 + z6), content_type="text/plain")
    await eventually(lambda: _total(client, 32))
    bus.renderer("--strategy", "by_zoom")
    await eventually(lambda: _rendered_count(bus, 20), timeout=30)
    first = [line["zoom"] for line in bus.render_log_lines()[:16]]
    share6 = first.count(6) / len(first)
    assert 0.6 <= share6 <= 0.97, first  # expected 0.8 while both zooms have work


async def _total(client, n):
    s = await stats(client)
    return s["queues"]["total"] == n


async def _rendered_count(bus, n):
    return len(bus.render_log_lines()) >= n


async def test_missing_strategy_leaves_background_work(bus):
    bus.queuemaster("--render-missing-expired")
    bus.renderer("--strategy", "missing")
    client = await bus.client()
    await wait_renderers(client, 1)
    await client.alert("expire_toposm", "8/0/0;8/8/8;8/16/16", content_type="text/plain")
    await eventually(lambda: _total(client, 3))
    reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "9/100/100"}, timeout=20)
    assert reply["metatile"] == "9/12/12"
    # `rendered` woke the dispatcher before it answered us, so by now the idle thread has been offered the
    # background work: still idle means its strategy turned it down.
    s = await stats(client)
    assert s["renderers"][0]["state"] == "idle"
    assert s["queues"]["by_zoom"] == {"8": 3}  # a `missing` renderer never takes background work
    assert [line["metatile"] for line in bus.render_log_lines()] == ["9/12/12"]


async def test_expiry_dedup_and_propagation_on_the_bus(bus):
    # existing tiles: a z14 metatile and its ancestors down to z12
    m14 = Tile(14, 8000, 6000).metatile
    for m in [m14, *m14.ancestors(12)]:
        render_metatile("testpattern", str(bus.tile_root), str(m))
    bus.queuemaster("--propagate-to-zoom", "12")
    client = await bus.client()
    await eventually(lambda: stats(client))
    # Spark-style: each metatile once as its top-left tile, plus duplicates of the same metatile
    await client.alert("expire_toposm", "14/8000/6000;14/8001/6001;14/8007/6007", content_type="text/plain")
    await client.alert("expire_toposm", "14/8003/6000;14/0/0", content_type="text/plain")

    async def settled():
        s = await stats(client)
        return s if s["counters"]["expired"] == 5 else None

    s = await eventually(settled)
    assert s["queues"]["by_zoom"] == {"12": 1, "13": 1, "14": 1}  # 14/0/0 was never rendered: skipped


async def test_expiry_during_render_renders_again(bus):
    bus.queuemaster()
    bus.renderer("--render-delay", "3")
    client = await bus.client()
    await wait_renderers(client, 1)
    request = await render_in_progress(client, "10/5/5")
    await client.alert("expire_toposm", "10/3/3", content_type="text/plain")
    assert (await request)["metatile"] == "10/0/0"
    await eventually(lambda: _rendered_count(bus, 2), timeout=15)
    assert [line["metatile"] for line in bus.render_log_lines()] == ["10/0/0", "10/0/0"]
    s = await stats(client)
    assert s["counters"]["rerender_after_expiry"] == 1


async def test_render_failure_answers_error(bus):
    bus.tile_root.mkdir(parents=True)
    (bus.tile_root / "7").write_text("a file where the zoom-7 directory should be")
    bus.queuemaster()
    bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    with pytest.raises(RequestError) as info:
        await client.call("toposm.queuemaster", {"command": "render", "tile": "7/3/3"}, timeout=20)
    assert info.value.id == "render_failed"
    assert "7/0/0" in info.value.detail and "Error" in info.value.detail  # the renderer's reason
    [line] = bus.render_log_lines()
    assert line["status"] == "error" and line["reason"]
    s = await stats(client)
    assert s["counters"]["failed"] == 1 and s["counters"]["rendered"] == 0
    # the renderer survives its failure and renders the next metatile
    ok = await client.call("toposm.queuemaster", {"command": "render", "tile": "8/3/3"}, timeout=20)
    assert ok["command"] == "rendered"


async def test_malformed_requests_fail(bus):
    bus.queuemaster("--max-zoom", "16")
    client = await bus.client()
    await eventually(lambda: stats(client))
    call = client.call
    with pytest.raises(UnknownCommand):
        await call("toposm.queuemaster", {"command": "fly"})
    with pytest.raises(InvalidParams, match="command"):
        await call("toposm.queuemaster", ["not", "an", "object"])
    for bad in ("15/40000/1", "x/y/z", "1/2", "15/-1/0"):
        with pytest.raises(RequestFailed, match="tile"):
            await call("toposm.queuemaster", {"command": "render", "tile": bad})
    with pytest.raises(RequestFailed, match="outside the configured range 0-16"):
        await call("toposm.queuemaster", {"command": "render", "tile": "17/0/0"})
    with pytest.raises(InvalidParams, match="tile"):
        await call("toposm.queuemaster", {"command": "render"})
    with pytest.raises(InvalidParams, match="strategy"):
        await call(
            "toposm.queuemaster",
            {"command": "register", "hostname": "h", "pid": 1, "threadid": 0, "strategy": "fastest"},
        )
    with pytest.raises(InvalidParams, match="hostname"):
        await call("toposm.queuemaster", {"command": "register", "hostname": "a.b", "pid": 1, "threadid": 0})
    with pytest.raises(InvalidParams, match="metatile"):
        await call("toposm.queuemaster", {"command": "rendered", "metatile": "3/1/0"})
    with pytest.raises(RequestFailed, match="x and y"):
        await call("toposm.queuemaster", {"command": "expire", "tiles": "5/1/1;5/99/1"})
    with pytest.raises(InvalidParams, match="no tiles"):
        await call("toposm.queuemaster", {"command": "expire", "tiles": " ; "})
    # bad expiry broadcasts are counted, valid items still taken
    await client.alert("expire_toposm", "garbage;;5/99/99", content_type="text/plain")
    await client.alert("expire_toposm", {"not": "text"})

    async def counted():
        s = await stats(client)
        c = s["counters"]
        return s if c.get("invalid_expiry_items") == 2 and c.get("invalid_expiry_messages") == 1 else None

    await eventually(counted)


async def test_stats_from_the_shell(bus):
    bus.queuemaster()
    client = await bus.client()
    await eventually(lambda: stats(client))
    out = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "qbroker"), "call", "--raw", "toposm.queuemaster", "stats"],
        env={"QBROKER_URL": bus.url, "PATH": str(BIN)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["command"] == "stats" and body["queues"]["total"] == 0 and body["uptime"] > 0


async def test_request_raises_queued_metatile_to_important(bus):
    for m in ("8/0/0", "8/1/1", "8/2/2"):
        render_metatile("testpattern", str(bus.tile_root), m)
    bus.queuemaster()
    bus.renderer("--strategy", "important")
    client = await bus.client()
    await wait_renderers(client, 1)
    await client.alert("expire_toposm", "8/0/0;8/8/8;8/16/16", content_type="text/plain")
    # The expiry woke the dispatcher before the queue showed 3, so the thread has been offered the work:
    # still idle means its strategy turned it down.
    await eventually(lambda: _total(client, 3))
    s = await stats(client)
    assert s["renderers"][0]["state"] == "idle"
    assert bus.render_log_lines() == []  # an `important` renderer leaves background work alone
    reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "8/9/10"}, timeout=20)
    assert reply["metatile"] == "8/1/1"  # queued in background, raised by the request, rendered
    s = await stats(client)
    assert s["queues"]["by_zoom"] == {"8": 2} and s["queues"]["important"] == 0
    assert [line["metatile"] for line in bus.render_log_lines()] == ["8/1/1"]


async def test_render_and_ping_reach_one_idle_thread_at_every_level(bus):
    """The seed's hierarchy for requests: toposm.render, .<host> and .<host>.<pid> each reach one idle thread."""
    bus.queuemaster()
    bus.renderer(threads=2)
    client = await bus.client()
    s = await wait_renderers(client, 2)
    thread_name = s["renderers"][0]["renderer"]  # toposm.render.<host>.<pid>.<threadid>
    pid_level = thread_name.rsplit(".", 1)[0]
    host_level = pid_level.rsplit(".", 1)[0]
    for level in ("toposm.render", host_level, pid_level):
        pong = await client.call(level, {"command": "ping"}, timeout=20)
        assert pong["command"] == "pong" and pong["state"] == "idle"
        assert pong["renderer"].startswith(pid_level + ".")
    accepted = await client.call(host_level, {"command": "render", "metatile": "9/1/2"}, timeout=20)
    assert accepted["command"] == "accepted" and accepted["renderer"].startswith(pid_level + ".")
    store = TileStore(bus.tile_root)

    async def drawn():
        return all(store.tile_exists(t) for t in Tile(9, 8, 16).metatile.tiles())

    await eventually(drawn)
    with pytest.raises(NoServer):  # no renderer on that host: answered at once, not at the deadline
        await client.call("toposm.render.nohost", {"command": "ping"}, timeout=20)
