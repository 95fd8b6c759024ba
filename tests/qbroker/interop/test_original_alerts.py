"""Alerts and gathers between qbroker and the original QBroker, both ways; bodyless messages leave it alive."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.conftest import MakeUnit
from tests.qbroker.interop.conftest import StartOriginal


async def test_alerts_and_gathers_both_ways(qbroker_units: MakeUnit, original: StartOriginal) -> None:
    unit = await qbroker_units("qb.listener")
    heard: asyncio.Queue[Any] = asyncio.Queue()

    @unit.on_alert("qb.news")
    async def news(body: Any = None) -> dict[str, Any]:
        heard.put_nowait(body)
        return {"seen": body}

    await unit.start()
    orig = await original("orig.listener")
    # qbroker -> original: an alert, and a gather of its listener's answers (application/json+obj).
    await unit.alert("orig.alert", {"n": 1})
    assert (await orig.next_event(name="orig.alert"))["data"] == {"n": 1}
    replies = [r async for r in unit.gather("orig.alert", {"n": 2}, timeout=5, max_replies=1)]
    assert [r.body for r in replies] == [{"heard": {"n": 2}}] and replies[0].error is None
    await orig.next_event(name="orig.alert")
    # original -> qbroker: an alert, and a poll (the original's gather) answered by the qbroker listener.
    assert (await orig.command("alert", name="qb.news", data={"n": 3}))["ok"] is None
    assert await asyncio.wait_for(heard.get(), 10) == {"n": 3}
    answer = await orig.command("poll", name="qb.news", data={"n": 4}, max_delay=2.0)
    assert answer["replies"] == [{"data": {"seen": {"n": 4}}}]
    assert orig.alive


async def test_bodyless_messages_leave_the_original_alive(qbroker_units: MakeUnit, original: StartOriginal) -> None:
    """Each of these once killed every original unit on the bus (an empty body under application/json)."""
    unit = await qbroker_units("qb.quiet")

    @unit.rpc("qb.fail")
    async def fail() -> None:
        raise RuntimeError("no")

    await unit.start()
    orig = await original("orig.victim")
    # README's own example: a gather without a body. The original's units answer it, and live.
    replies = [r async for r in unit.gather("qbroker.ping", timeout=3)]
    assert orig.uuid in {r.body.get("uuid") for r in replies if isinstance(r.body, dict)}
    await unit.alert("orig.alert")  # an alert without a body reaches its listener as None
    assert (await orig.next_event(name="orig.alert"))["data"] is None
    assert await unit.call("orig.echo") is None  # a call without a body
    # An error reply (no body) and a dead-letter answer (no body) to the original's own calls.
    assert (await orig.rpc("qb.fail"))["error"]["type"] == "RuntimeError"
    assert (await orig.rpc("nobody.serves.this"))["error"]["type"] == "DeadLettered"
    assert orig.alive
    assert await unit.call("orig.echo", "alive?") == "alive?"


async def test_an_original_ping_of_another_app_is_not_answered(
    qbroker_units: MakeUnit, original: StartOriginal
) -> None:
    """The original's ping may name the app (or uuid) it asks for: qbroker units keep to it."""
    unit = await qbroker_units("qb.pinged")
    await unit.start()
    orig = await original("orig.pinger", serve=False)
    everyone = await orig.command("poll", name="qbroker.ping", max_delay=1.5)
    assert unit.uuid in {r["data"]["uuid"] for r in everyone["replies"]}
    others = await orig.command("poll", name="qbroker.ping", data={"app": "some.other.app"}, max_delay=1.0)
    assert others["replies"] == []
    mine = await orig.command("poll", name="qbroker.ping", data={"app": "qb.pinged"}, max_delay=1.5)
    assert [r["data"]["uuid"] for r in mine["replies"]] == [unit.uuid]
