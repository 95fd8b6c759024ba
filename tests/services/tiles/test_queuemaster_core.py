"""The queuemaster's decisions without the bus: expiry, requests, waiters, renderer loss."""

import asyncio
import json

import pytest

from qbroker import RequestError, RequestFailed
from services.tiles.queuemaster import expiry_intake
from services.tiles.queuemaster.state_machine import Queuemaster, QueuemasterSettings
from services.tiles.renderer.worker import render_metatile
from services.toposm.messages import RegisterRequest, RenderedRequest, UnregisterRequest
from services.toposm.tilemath import Metatile, Tile, ZoomRange


def make_qm(tmp_path, **kw):
    settings = QueuemasterSettings(
        tile_root=tmp_path / "tiles",
        state_file=tmp_path / "q.sqlite",
        render_log=tmp_path / "render.log",
        zooms=ZoomRange(0, 16),
        seed=1,
        **kw,
    )
    return Queuemaster(settings)


async def requested(qm, tile, **kw):
    """Start a ``render`` request; return its task once its waiter is in place (request() then says so)."""
    qm.work_available.clear()
    task = asyncio.create_task(qm.request(tile, **kw))
    await asyncio.wait_for(qm.work_available.wait(), 10)
    return task


def register(qm, threadid=0, strategy="by_work_available", metatile=None):
    req = RegisterRequest(hostname="h", pid=1, threadid=threadid, strategy=strategy, metatile=metatile)
    qm.register(req, reply_to="renderer-uuid")
    return qm.threads.get(req.endpoint)


def test_expiry_only_existing_dedup_and_propagation(tmp_path):
    qm = make_qm(tmp_path, propagate_to_zoom=10)
    m12 = Tile(12, 2000, 1400).metatile
    for m in [m12, m12.ancestor(11), m12.ancestor(10)]:
        render_metatile("testpattern", str(tmp_path / "tiles"), str(m))
    # three tiles of one metatile, one never-rendered metatile, one invalid item
    text = "12/2000/1400;12/2001/1400;12/2007/1407;12/0/0;12/99999/0"
    out = qm.expire(text, strict=False)
    assert out["tiles"] == 4 and out["invalid"] == 1
    # 12/0/0's metatile and its ancestors 11/0/0, 10/0/0 were never rendered: skipped
    assert out["queued"] == 3 and out["not_rendered_yet"] == 3
    assert qm.queue.background_by_zoom() == {12: 1, 11: 1, 10: 1}
    assert qm.expire("12/2003/1403", strict=False)["merged"] == 3  # same metatile and ancestors again
    with pytest.raises(RequestFailed) as info:
        qm.expire(text, strict=True)
    assert info.value.id == "invalid_tile"
    assert info.value.detail == "tile '12/99999/0': x and y must be below 2^12 = 4096"


def test_expiry_can_render_missing(tmp_path):
    qm = make_qm(tmp_path, render_missing_expired=True)
    out = qm.expire("12/0/0;12/9/9;5/1/1", strict=False)
    assert out["queued"] == 3
    assert qm.queue.background_by_zoom() == {12: 2, 5: 1}


async def test_request_waits_and_all_waiters_answered(tmp_path):
    qm = make_qm(tmp_path)
    thread = register(qm)
    waiters = [await requested(qm, f"9/{x}/3") for x in (0, 1, 7)]
    assert qm.queue.missing == 1
    [(t, m)] = qm.next_assignments()
    assert t is thread and m == Metatile(9, 0, 0)
    assert not any(w.done() for w in waiters)
    render_metatile("testpattern", str(tmp_path / "tiles"), str(m))
    qm.rendered(RenderedRequest(metatile=str(m), duration=0.5))
    results = await asyncio.gather(*waiters)
    assert [r["tile"] for r in results] == ["9/0/3", "9/1/3", "9/7/3"]
    assert all(r["command"] == "rendered" and r["metatile"] == "9/0/0" for r in results)
    assert thread.idle
    # fresh now: answered without queueing
    assert (await qm.request("9/2/2"))["metatile"] == "9/0/0"
    assert qm.queue.queued_count() == 0
    log = [json.loads(line) for line in (tmp_path / "render.log").read_text().splitlines()]
    assert log[0]["metatile"] == "9/0/0" and log[0]["zoom"] == 9 and log[0]["status"] == "ok"
    assert log[0]["renderer"] == "toposm.render.h.1.0" and log[0]["duration"] == 0.5


async def test_failed_render_answers_error(tmp_path):
    qm = make_qm(tmp_path)
    register(qm)
    waiter = await requested(qm, "4/1/1")
    [(_, m)] = qm.next_assignments()
    qm.rendered(RenderedRequest(metatile=str(m), status="error", reason="disk full"))
    with pytest.raises(RequestError, match="disk full") as info:
        await waiter
    assert info.value.id == "render_failed"
    assert qm.stats.counters["failed"] == 1


async def test_lost_renderer_requeues_at_front_and_waiter_survives(tmp_path):
    qm = make_qm(tmp_path, render_missing_expired=True)
    a = register(qm, 0)
    qm.expire("10/0/0;10/8/0;10/16/0", strict=False)
    waiter = await requested(qm, "11/0/0")
    [(thread, m)] = qm.next_assignments()
    assert thread is a and m == Metatile(11, 0, 0)  # missing first
    qm.thread_lost(a, "test")
    assert qm.queue.missing == 1 and len(qm.threads) == 0
    b = register(qm, 1)
    [(thread, m2)] = qm.next_assignments()
    assert thread is b and m2 == m
    qm.rendered(RenderedRequest(metatile=str(m2)))
    assert (await waiter)["metatile"] == "11/0/0"


def test_unregister_and_reregister_with_metatile(tmp_path):
    qm = make_qm(tmp_path, render_missing_expired=True)
    qm.expire("10/0/0;10/8/0", strict=False)
    t = register(qm, 0)
    [(_, m)] = qm.next_assignments()
    # queuemaster "restarts": a new instance on the same state file; the renderer re-registers with m
    qm2 = make_qm(tmp_path, render_missing_expired=True)
    assert qm2.queue.state_of(m) == "background"  # back in the queue until claimed
    t2 = register(qm2, 0, metatile=str(m))
    assert qm2.queue.state_of(m) == "rendering" and t2.metatile == m
    assert qm2.unregister(UnregisterRequest(), "renderer-uuid")["renderers"] == [t.endpoint]
    assert qm2.queue.state_of(m) == "background"
    assert qm2.unregister(UnregisterRequest(), "someone-else")["renderers"] == []


def test_strategy_missing_only_leaves_background(tmp_path):
    qm = make_qm(tmp_path, render_missing_expired=True)
    qm.expire("10/0/0", strict=False)
    register(qm, 0, strategy="missing")
    assert qm.next_assignments() == []
    register(qm, 1, strategy="important:1,by_zoom:1")
    [(t, m)] = qm.next_assignments()
    assert t.threadid == 1 and m == Metatile(10, 0, 0)


def test_stats_shape(tmp_path):
    qm = make_qm(tmp_path, render_missing_expired=True)
    register(qm)
    qm.expire("10/0/0;12/0/0;12/100/100", strict=False)
    s = qm.describe()
    assert s["queues"]["by_zoom"] == {"10": 1, "12": 2}
    assert s["queues"]["missing"] == 0 and s["queues"]["important"] == 0
    assert s["renderers"][0]["strategy"] == "by_work_available" and s["renderers"][0]["state"] == "idle"
    assert s["counters"]["expired"] == 3 and "uptime" in s and "render_time" in s


async def test_late_report_from_replaced_thread_satisfies_waiters(tmp_path):
    qm = make_qm(tmp_path)
    a = register(qm, 0)
    waiter = await requested(qm, "6/1/1")
    [(_, m)] = qm.next_assignments()
    qm.thread_lost(a, "missed pings")  # it was only slow
    b = register(qm, 1)
    [(thread, again)] = qm.next_assignments()
    assert thread is b and again == m
    late = qm.rendered(RenderedRequest(metatile=str(m), hostname="h", pid=1, threadid=0))
    assert late["expected"] is False
    assert (await waiter)["metatile"] == "6/0/0"
    assert b.metatile == m  # b still renders it and reports for itself
    assert qm.rendered(RenderedRequest(metatile=str(m), hostname="h", pid=1, threadid=1))["expected"]
    assert b.idle


async def test_waiter_ends_at_the_request_deadline_and_leaves_no_trace(tmp_path):
    import time

    qm = make_qm(tmp_path)
    with pytest.raises(RequestError) as info:
        await qm.request("12/2000/1400", deadline=time.time() + 0.05)  # nobody renders it
    assert info.value.id == "render_timeout"
    assert qm.waiters == {} and qm.waiting == 0  # the waiter is gone, not leaked
    # ...and so is the metatile it alone had queued: nobody waits for it any more
    assert qm.queue.state_of(Tile(12, 2000, 1400).metatile) is None
    assert qm.stats.counters["abandoned_dropped"] == 1
    qm.close()


async def test_waiters_are_capped(tmp_path):
    qm = make_qm(tmp_path, max_waits=2, max_waits_per_account=1)
    first = await requested(qm, "12/0/0", user="a")
    second = await requested(qm, "12/8/8", user="b")
    with pytest.raises(RequestError) as info:
        await qm.request("12/16/16", user="c")
    assert info.value.id == "busy"
    assert qm.queue.state_of(Tile(12, 16, 16).metatile) is None  # refused before it was queued
    qm.fail_waiters()
    for task in (first, second):
        with pytest.raises(RequestError):
            await task
    assert qm.waiting == 0
    qm.close()


async def test_big_expiry_broadcast_is_taken_in_chunks(tmp_path):
    """A big `expire_toposm` list is queued in chunks, the loop running other work in between."""
    import time

    from services.tiles.queuemaster.commands import expire_broadcast

    qm = make_qm(tmp_path, render_missing_expired=True)
    text = ";".join(f"14/{x}/{y}" for x in range(400) for y in range(400))  # 160,000 tiles, ~1.8 MB
    turns, longest, stop = 0, 0.0, False

    async def ticker():
        nonlocal turns, longest
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0)
            now = time.perf_counter()
            turns, longest, last = turns + 1, max(longest, now - last), now

    task = asyncio.create_task(ticker())
    out = await expire_broadcast(qm, text.encode())
    stop = True
    await task
    assert out is not None and out["tiles"] == 160_000 and out["invalid"] == 0
    assert qm.queue.queued_count() == 50 * 50  # every metatile queued once
    assert turns > len(text) // expiry_intake.EXPIRY_CHUNK_CHARS // 2  # other work ran between chunks
    print(f"\nEXPIRY-CHUNK: {len(text)} bytes in {turns} loop turns, longest hold {longest * 1000:.1f} ms")
    qm.close()


def test_rendered_with_next_hands_the_thread_its_next_metatile(tmp_path):
    """`next`: the answer to `rendered` carries the thread's next metatile (no `render` round trip); a
    retried report (its answer lost) gets the same answer, not a second metatile."""
    qm = make_qm(tmp_path, render_missing_expired=True)
    qm.expire("10/0/0;10/8/0;10/16/0", strict=False)
    t = register(qm, 0)
    [(_, m1)] = qm.next_assignments()
    report = RenderedRequest(metatile=str(m1), next=True, hostname="h", pid=1, threadid=0)
    answer = qm.rendered(report)
    assert answer["expected"] and answer["render"] != str(m1)
    assert str(t.metatile) == answer["render"] and not t.pending and qm.next_assignments() == []
    assert qm.rendered(report) == answer  # the retry: same metatile handed, nothing else in flight
    assert qm.queue.in_flight_count() == 1
    m2 = t.metatile
    last = qm.rendered(RenderedRequest(metatile=str(m2), next=True))
    m3 = t.metatile
    assert last["render"] == str(m3) and m3 not in (m1, m2)
    assert "render" not in qm.rendered(RenderedRequest(metatile=str(m3), next=True))  # queue empty: idle
    assert t.idle and qm.queue.queued_count() == 0
    # without `next`, nothing is handed out in the answer
    qm.expire("10/24/0", strict=False)
    [(_, m4)] = qm.next_assignments()
    assert "render" not in qm.rendered(RenderedRequest(metatile=str(m4)))
