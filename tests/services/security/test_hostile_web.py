"""An anonymous HTTP client against ``toposm-web`` (docs/security.md): plain HTTP to the real process,
with the real queuemaster (and a test-pattern renderer where a render must finish) on a vhost of their own.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from typing import Any

import aiohttp
import orjson

from harness import HANG, eventually
from qbroker import Config, Unit
from tests.services.tiles.conftest import TileBus, bus, pytest_runtest_makereport, stats, wait_renderers  # noqa: F401
from tests.services.web.conftest import Web, start_web


async def post_render(session: aiohttp.ClientSession, web: Web, tile: str) -> int:
    async with session.post(web.url + "/api/render", json={"tile": tile}) as response:
        await response.read()
        return response.status


async def counters(tb: TileBus) -> dict[str, int]:
    result: dict[str, int] = (await stats(await tb.client()))["counters"]
    return result


async def test_refused_rerenders_never_reach_the_queuemaster(bus: TileBus) -> None:  # noqa: F811
    """300 posts from one address: only the admitted ones may expire or request anything."""
    bus.queuemaster()
    await wait_renderers(await bus.client(), 0)  # no renderer: admitted renders stay in flight
    web = start_web(bus, "--render-timeout", "60")
    before = await counters(bus)
    async with aiohttp.ClientSession() as session:
        # distinct metatiles, then one metatile over and over
        tiles = [f"12/{8 * i}/0" for i in range(250)] + ["12/0/8"] * 50
        answers = Counter(await asyncio.gather(*(post_render(session, web, t) for t in tiles)))
    admitted = answers[202]
    assert set(answers) <= {202, 429} and 1 <= admitted <= 8 + 50, answers
    after = await counters(bus)
    # each admitted post that started a render expired its metatile once; joiners and refusals sent nothing
    expired = after["expired"] - before["expired"]
    assert 1 <= expired <= 8, (expired, answers)

    async def requested() -> int | None:
        grown = (await counters(bus))["requested"] - before["requested"]
        return grown if grown >= expired else None

    assert await eventually(requested) == expired, answers


async def test_rerender_of_a_fresh_tile_is_a_no_op_and_rerenders_are_rate_limited(bus: TileBus) -> None:  # noqa: F811
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    web = start_web(bus, "--rerenders-per-minute", "3", "--render-timeout", "20")
    async with aiohttp.ClientSession() as session:
        async with session.get(web.url + "/tiles/7/3/3.png") as response:
            assert response.status == 200, await response.text()
        before = await counters(bus)
        assert await post_render(session, web, "7/3/3") == 202  # a fresh tile may be re-rendered once

        async def rerendered() -> dict[str, int] | None:
            now = await counters(bus)
            return now if now["rendered"] > before["rendered"] else None

        rendered = await eventually(rerendered)
        for _ in range(20):  # then, within --rerender-interval, asking again changes nothing
            async with session.post(web.url + "/api/render", json={"tile": "7/3/3"}) as response:
                assert response.status == 200 and (await response.json())["state"] == "fresh"
        after = await counters(bus)
        assert after["expired"] == before["expired"] + 1 == rendered["expired"]
        assert after["requested"] == rendered["requested"]
        answers = [await post_render(session, web, f"9/{8 * i}/8") for i in range(6)]
    assert answers.count(202) == 2 and answers[2:] == [429] * 4, answers  # the first of 3 went to 7/3/3


async def test_sigterm_stops_within_the_drain_timeout_after_a_flood(bus: TileBus) -> None:  # noqa: F811
    """Tile requests waiting for renders, a flood of re-renders, the queuemaster killed: SIGTERM must
    still end the process within its drain timeout (it used to log `stopping` and go on)."""
    qm = bus.queuemaster()
    await wait_renderers(await bus.client(), 0)
    web = start_web(bus, "--render-timeout", "60")
    async with aiohttp.ClientSession() as session:

        async def get(path: str) -> Any:
            async with session.get(web.url + path) as response:
                return response.status

        async def in_flight(n: int) -> bool:
            async with session.get(web.url + "/metrics") as response:
                return f"toposm_web_on_demand_renders {n}.0" in await response.text()

        waiting = [asyncio.create_task(get(f"/tiles/11/{8 * i}/16.png")) for i in range(6)]
        await eventually(lambda: in_flight(6))
        await asyncio.gather(*(post_render(session, web, f"11/{8 * i}/64") for i in range(300)))
        await eventually(lambda: in_flight(8))
        qm.kill()
        os.killpg(web.proc.pid, signal.SIGTERM)
        # A ceiling that only catches a hang (before the fix it still ran minutes later); the drain timeout
        # itself is the service's own bound, not something a loaded machine's clock can check.
        code = await asyncio.to_thread(web.proc.popen.wait, HANG)
        answers = await asyncio.gather(*waiting, return_exceptions=True)
    assert code == 0, web.proc.log.read_text()[-2000:]
    # the waiting requests were answered (503, stopping), not left hanging
    assert all(a == 503 or isinstance(a, aiohttp.ClientError) for a in answers), answers


async def open_stream(session: aiohttp.ClientSession, web: Web) -> tuple[int, aiohttp.ClientResponse]:
    response = await session.get(web.url + "/events")
    if response.status == 200:
        await response.content.readuntil(b"\n\n")  # the first snapshot: the stream is counted and live
    return response.status, response


async def test_one_address_cannot_take_every_live_stream(bus: TileBus) -> None:  # noqa: F811
    """200 `/events` streams from 127.0.0.1, then a viewer from 127.0.0.2: it must still get its stream."""
    web = start_web(bus)
    flood = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    other = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
    try:
        opened = await asyncio.gather(*(open_stream(flood, web) for _ in range(200)))
        answers = Counter(status for status, _ in opened)
        assert answers[200] <= 10 and set(answers) <= {200, 429}, answers
        status, _ = await open_stream(other, web)
        assert status == 200, answers
    finally:
        await flood.close()
        await other.close()


async def test_metrics_and_status_stay_bounded_when_a_unit_answers_ping_with_50000_keys(bus: TileBus) -> None:  # noqa: F811
    """A unit on the bus answers `qbroker.ping` with 50,000 dead-letter keys carrying control characters."""
    hostile = Unit("evil.unit", config=Config(url=bus.url))
    keys = {f"rpc.reason-{i}\x1b]0;owned\x07\x1b[2J\x9b": 1 for i in range(50_000)}
    keys["rpc.no_server"] = 100  # the one real count: kept by name

    @hostile.on_alert("qbroker.ping")
    async def ping(body: Any) -> dict[str, Any]:
        return {"app": "evil\x1b[2J", "host": "h" * 5000, "pid": 1, "uptime": 1, "dead_letters": keys}

    await hostile.start()
    bus.units.append(hostile)

    web = start_web(bus)
    async with aiohttp.ClientSession() as session:

        async def polled() -> bytes | None:
            async with session.get(web.url + "/api/status") as response:
                body = await response.read()
            return body if b'"rpc.no_server":100' in body else None

        status_body = await eventually(polled)
        async with session.get(web.url + "/metrics") as response:
            text = await response.text()
    # /metrics holds toposm-web's own figures only: nothing a unit said in its ping (docs/metrics.md).
    assert "reason-" not in text and "evil" not in text and "qbroker_dead_letters{" not in text
    assert len(text) < 200_000, len(text)
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in text)
    assert len(status_body) < 200_000, len(status_body)
    status = orjson.loads(status_body)
    assert len(status["dead_letters"]) <= 21 and status["dead_letters"]["rpc.no_server"] == 100
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in orjson.dumps(status).decode())
