"""Waiting requests against the real queuemaster process on RabbitMQ: requests whose callers all gave up
leave the queue to the ones still waiting, and a SIGTERM with thousands waiting ends right after the drain
(docs/tiles.md "Requests and waiters", docs/security.md "Attacks and answers": parked render requests)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from typing import Any

from harness import HANG, eventually
from qbroker import CallTimeout, RequestError
from tests.services.tiles.conftest import TileBus, stats

QM = "toposm.queuemaster"


async def test_requests_whose_callers_all_gave_up_leave_the_queue_to_one_still_waiting(bus: TileBus) -> None:
    """500 renders of distinct z18 metatiles, each with a 1 s deadline and nobody to render them: once
    their callers have given up, the metatiles are out of the `missing` queue, and another client's tile is
    the first one rendered when a renderer comes."""
    bus.queuemaster()
    client = await bus.client()
    await eventually(lambda: stats(client), context=bus.logs)
    tiles = [f"18/{8 * i}/0" for i in range(500)]
    answers = await asyncio.gather(
        *(client.call(QM, {"command": "render", "tile": tile}, timeout=1) for tile in tiles), return_exceptions=True
    )
    # each gave up: at its deadline, or (a busy machine) before the queuemaster took it at all
    given_up = ("render_timeout", "deadline_passed")
    assert all(isinstance(a, CallTimeout) or (isinstance(a, RequestError) and a.id in given_up) for a in answers), {
        repr(a) for a in answers
    }

    async def let_go() -> bool:
        queues = (await stats(client))["queues"]
        return bool(queues["missing"] == 0 and queues["total"] == 0)

    await eventually(let_go, context=bus.logs)
    other = await bus.client()
    bus.renderer()
    answer = await other.call(QM, {"command": "render", "tile": "18/4000/4000"}, timeout=HANG)
    assert [line["metatile"] for line in bus.render_log_lines()] == [answer["metatile"]]


def _events(log_text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_text.splitlines() if line.startswith("{")]


async def test_sigterm_with_thousands_waiting_ends_within_the_drain_and_loses_none(
    bus: TileBus, monkeypatch: Any
) -> None:
    """5,000 waits, SIGTERM, a 0.1 s drain timeout: the queuemaster answers `queuemaster_stopped` from the
    requests' rows for half the drain timeout, keeps the rest for its next run, cancels their handlers and
    exits (a ceiling catches a hang; no wall time is asserted). The next run (with a renderer) answers every
    request kept: each caller gets exactly one answer, none is lost."""
    monkeypatch.setenv("QBROKER_LOG_FORMAT", "json")
    n = 5_000
    options = ("--max-waits-per-account", str(n), "--max-waits", str(2 * n))
    first = bus.queuemaster("--drain-timeout", "0.1", *options)
    client = await bus.client()
    await eventually(lambda: stats(client), context=bus.logs)
    calls = [
        asyncio.create_task(client.call(QM, {"command": "render", "tile": "18/0/0"}, timeout=10 * HANG))
        for _ in range(n)
    ]

    async def parked() -> bool:
        return bool((await stats(client))["waiting_requests"] == n)

    await eventually(parked, context=bus.logs)
    os.killpg(first.pid, signal.SIGTERM)
    assert await asyncio.to_thread(first.popen.wait, HANG) == 0  # a ceiling to catch a hang only
    events = _events(first.log.read_text())
    names = [e["event"] for e in events]
    [stop] = [e for e in events if e["event"] == "waiting requests answered at stop"]
    assert stop["answered"] + stop["kept"] == n
    assert names.index("waiting requests answered at stop") < names.index("unit stopped")
    with sqlite3.connect(bus.state_file) as db:
        assert db.execute("SELECT count(*) FROM waiters").fetchone()[0] == stop["kept"]

    async def answered(count: int) -> bool:
        return sum(call.done() for call in calls) == count

    await eventually(lambda: answered(stop["answered"]), context=bus.logs)
    bus.queuemaster(*options)  # the next run answers the requests kept, once their metatile is rendered
    bus.renderer()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), HANG)
    stopped = [r for r in results if isinstance(r, RequestError) and r.id == "queuemaster_stopped"]
    rendered = [r for r in results if isinstance(r, dict) and r["command"] == "rendered"]
    assert (len(stopped), len(rendered)) == (stop["answered"], stop["kept"])
