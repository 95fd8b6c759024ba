"""Alerts: fire-and-forget, topic patterns, gather (count, deadline, gap), discovery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from harness import HANG, eventually
from qbroker import Reply, RequestContext, Unit
from qbroker.alerts import topic_matches
from tests.conftest import MakeUnit


def test_topic_patterns() -> None:
    assert topic_matches("toposm.render.#", "toposm.render")
    assert topic_matches("toposm.render.#", "toposm.render.vader.55823.3")
    assert topic_matches("#", "anything.at.all")
    assert topic_matches("toposm.*", "toposm.queuemaster")
    assert not topic_matches("toposm.*", "toposm.render.vader")
    assert topic_matches("*.render.#", "toposm.render.vader")
    assert not topic_matches("toposm.render", "toposm.render.vader")


async def test_fire_and_forget_reaches_every_matching_listener(make_unit: MakeUnit) -> None:
    received: dict[str, list[object]] = {"a": [], "b": [], "c": []}
    for key, pattern in (("a", "toposm.render.#"), ("b", "toposm.render.vader.#"), ("c", "expire_toposm")):
        unit = await make_unit(f"test.listener.{key}")

        @unit.on_alert(pattern)
        async def listener(body: object, key: str = key) -> None:
            received[key].append(body)

        await unit.start()
    sender = await make_unit("test.sender")
    await sender.start()
    await sender.alert("toposm.render.vader", {"command": "queuemaster online"})
    await sender.alert("toposm.render.luke", {"command": "queuemaster online"})
    await sender.alert("expire_toposm", "14/5672/3452;14/5673/3452", content_type="text/plain")
    await eventually(lambda: len(received["a"]) == 2 and received["b"] and received["c"], timeout=HANG)
    assert received["a"] == [{"command": "queuemaster online"}] * 2
    assert received["b"] == [{"command": "queuemaster online"}]
    assert received["c"] == ["14/5672/3452;14/5673/3452"]


async def _responders(make_unit: MakeUnit, delays: list[float | None], held: asyncio.Event) -> list[Unit]:
    """One unit per delay answering ``t.census``; a ``None`` delay answers only once ``held`` is set."""
    units = []
    for i, delay in enumerate(delays):
        unit = await make_unit(f"test.responder{i}")

        @unit.on_alert("t.census")
        async def answer(ctx: RequestContext, delay: float | None = delay, i: int = i) -> dict[str, int]:
            if delay is None:
                await held.wait()
            else:
                await asyncio.sleep(delay)
            return {"responder": i}

        await unit.start()
        units.append(unit)
    return units


async def test_gather_stops_on_count(make_unit: MakeUnit) -> None:
    held = asyncio.Event()
    await _responders(make_unit, [0, 0, 0, None], held)
    asker = await make_unit("test.asker")
    await asker.start()
    # The deadline is far beyond the ceiling: only the count can end this gather in time.
    gathering = asker.gather("t.census", {}, timeout=10 * HANG, max_replies=3)
    replies = await asyncio.wait_for(_collect(gathering), HANG)
    assert sorted(r.body["responder"] for r in replies) == [0, 1, 2]
    held.set()


async def test_gather_stops_on_deadline(make_unit: MakeUnit) -> None:
    held = asyncio.Event()
    await _responders(make_unit, [0, 0.1, None], held)
    asker = await make_unit("test.asker")
    await asker.start()
    replies = await asyncio.wait_for(_collect(asker.gather("t.census", {}, timeout=3)), HANG)
    assert sorted(r.body["responder"] for r in replies) == [0, 1]  # the held one answers only afterwards
    held.set()


async def test_gather_stops_on_gap(make_unit: MakeUnit) -> None:
    held = asyncio.Event()
    await _responders(make_unit, [0, 0.05, None], held)
    asker = await make_unit("test.asker")
    await asker.start()
    gathering = asker.gather("t.census", {}, timeout=10 * HANG, gap=0.5)
    replies = await asyncio.wait_for(_collect(gathering), HANG)
    assert sorted(r.body["responder"] for r in replies) == [0, 1]
    held.set()


async def _collect(replies: AsyncIterator[Reply]) -> list[Reply]:
    return [reply async for reply in replies]


async def test_discovery_by_ping(make_unit: MakeUnit) -> None:
    server = await make_unit("test.discoverable")

    @server.rpc("t.discover.echo")
    async def echo(text: str, times: int = 1) -> str:
        return text * times

    qm = server.commands("t.discover.qm")

    @qm.command("render")
    async def render(tile: str) -> None:
        return None

    await server.start()
    asker = await make_unit("test.asker")
    await asker.start()
    found = {}
    async for reply in asker.gather("qbroker.ping", {}, timeout=3, gap=0.5):
        found[reply.body["uuid"]] = reply.body
    info = found[server.uuid]
    assert info["app"] == "test.discoverable"
    schema = info["endpoints"]["t.discover.echo"]["schema"]
    assert schema["required"] == ["text"]
    assert set(schema["properties"]) == {"text", "times"}
    assert info["endpoints"]["t.discover.qm"]["commands"]["render"]["required"] == ["tile"]
    assert asker.uuid in found


async def test_start_and_stop_are_announced(make_unit: MakeUnit) -> None:
    seen: list[tuple[str, dict[str, object]]] = []
    watcher = await make_unit("test.watcher")

    @watcher.on_alert("qbroker.*")
    async def watch(body: dict[str, object], ctx: RequestContext) -> None:
        seen.append((ctx.name or "", body))

    await watcher.start()
    unit = await make_unit("test.announced")

    @unit.rpc("t.announced")
    async def noop() -> None:
        return None

    await unit.start()
    await unit.stop()
    await eventually(
        lambda: any(name == "qbroker.stop" and body["uuid"] == unit.uuid for name, body in seen), timeout=HANG
    )
    start = next(body for name, body in seen if name == "qbroker.start" and body["uuid"] == unit.uuid)
    assert start["app"] == "test.announced"
    assert start["endpoints"] == ["t.announced"]
    assert any(name == "qbroker.stop" and body["uuid"] == unit.uuid for name, body in seen)
