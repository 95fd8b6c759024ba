"""What waiting requests may hold (no bus): per-account and total caps, a default deadline, and the place a
metatile keeps in the queue once everybody who asked for it has given up (docs/tiles.md "Requests and
waiters")."""

import asyncio
import time

import pytest

from harness import HANG
from qbroker import RequestError
from services.tiles.queuemaster.bulk import bulk_render
from services.tiles.queuemaster.state_machine import Queuemaster, QueuemasterSettings
from services.tiles.renderer.worker import render_metatile
from services.toposm.messages import BulkRenderRequest
from services.toposm.tilemath import Metatile, ZoomRange


def make_qm(tmp_path, **kw):
    settings = QueuemasterSettings(
        tile_root=tmp_path / "tiles", state_file=tmp_path / "q.sqlite", zooms=ZoomRange(0, 18), seed=1, **kw
    )
    return Queuemaster(settings)


async def parked(qm, tile, user, deadline=None):
    """A ``render`` request of ``user``'s, once its waiter is in place."""
    before = qm.render_waiters.held_by(user)
    task = asyncio.create_task(qm.request(tile, user=user, deadline=deadline))
    while qm.render_waiters.held_by(user) == before and not task.done():
        await asyncio.sleep(0)
    return task


async def refused(qm, tile, user) -> RequestError:
    with pytest.raises(RequestError) as info:
        await asyncio.wait_for(qm.request(tile, user=user), HANG)
    return info.value


async def timed_out(task) -> None:
    with pytest.raises(RequestError) as info:
        await asyncio.wait_for(task, HANG)
    assert info.value.id == "render_timeout"


async def test_what_one_account_holds_never_gets_another_refused(tmp_path):
    qm = make_qm(tmp_path, max_waits=7, max_waits_per_account=3)
    hog = [await parked(qm, "18/0/0", "hog") for _ in range(3)]
    error = await refused(qm, "18/8/8", "hog")
    assert error.id == "busy" and "'hog' has 3 requests waiting" in str(error)
    assert qm.queue.state_of(Metatile(18, 1, 1)) is None  # refused before it was queued
    others = [await parked(qm, "18/16/16", "other") for _ in range(3)]  # the hog's waits cost it nothing
    assert qm.describe()["waiting_requests"] == 6
    assert (await refused(qm, "18/8/8", "other")).id == "busy"
    # the total is what bounds memory: a third account's seventh wait fits, the eighth does not
    last = await parked(qm, "18/24/24", "third")
    assert (await refused(qm, "18/32/32", "third")).id == "busy"
    assert qm.stats.counters["requests_refused_account"] == 2 and qm.stats.counters["requests_refused_busy"] == 1
    qm.fail_waiters()
    await asyncio.gather(*hog, *others, last, return_exceptions=True)
    assert qm.waiting == 0 and qm.render_waiters.by_account == {}
    qm.close()


def test_the_per_account_cap_stays_below_the_total(tmp_path):
    with pytest.raises(ValueError, match="below --max-waits"):
        make_qm(tmp_path, max_waits=100, max_waits_per_account=100)


async def test_a_wait_without_a_deadline_ends_at_the_default_one(tmp_path):
    qm = make_qm(tmp_path, default_deadline=0.05)
    task = asyncio.create_task(qm.request("18/0/0"))  # no deadline: the seed's osm wire, a raw AMQP client
    await timed_out(task)
    assert qm.waiting == 0
    qm.close()


async def test_an_abandoned_request_gives_back_the_place_it_gave(tmp_path):
    qm = make_qm(tmp_path)
    stale, bulk, expired, shared = Metatile(16, 0, 0), Metatile(16, 1, 0), Metatile(16, 2, 0), Metatile(16, 3, 0)
    render_metatile("testpattern", str(tmp_path / "tiles"), str(stale))
    qm.expire("16/0/0", strict=False)
    assert qm.queue.state_of(stale) == "background"
    soon = time.time() + 0.2
    # a stale metatile, raised to important by a request: back to background
    raised = await parked(qm, "16/0/0", "a", deadline=soon)
    assert qm.queue.state_of(stale) == "important"
    # a bulk one, raised to missing: back to bulk (its own bulk request has gone too)
    pre = asyncio.create_task(bulk_render(qm, BulkRenderRequest(metatile=str(bulk)), "b"))
    while qm.queue.state_of(bulk) != "bulk":
        await asyncio.sleep(0)
    on_bulk = await parked(qm, "16/8/0", "a", deadline=soon)
    assert qm.queue.state_of(bulk) == "missing"
    # queued by a request, then expired (--render-missing-expired): back to background, not dropped
    qm.settings.render_missing_expired = True
    on_expired = await parked(qm, "16/16/0", "a", deadline=soon)
    qm.expire("16/16/0", strict=False)
    assert qm.queue.state_of(expired) == "missing"
    # never rendered, queued by a request, then expired without --render-missing-expired: still dropped
    # (the expiry alone would not have queued it)
    qm.settings.render_missing_expired = False
    never = Metatile(16, 4, 0)
    on_never = await parked(qm, "16/32/0", "a", deadline=soon)
    qm.expire("16/32/0", strict=False)
    qm.settings.render_missing_expired = True
    # asked for by two: the one who stays keeps its place
    leaving = await parked(qm, "16/24/0", "a", deadline=soon)
    staying = await parked(qm, "16/24/0", "b", deadline=time.time() + HANG)
    for task in (raised, on_bulk, on_expired, on_never, leaving):
        await timed_out(task)
    pre.cancel()
    assert qm.queue.state_of(stale) == "background"
    assert qm.queue.state_of(bulk) == "bulk"
    assert qm.queue.state_of(expired) == "background"
    assert qm.queue.state_of(shared) == "missing"
    assert qm.queue.state_of(never) is None and qm.stats.counters["abandoned_dropped"] == 1
    assert qm.queue.missing == 1 and qm.queue.important == 0
    assert qm.stats.counters["abandoned_lowered"] == 3
    staying.cancel()
    await asyncio.gather(staying, pre, return_exceptions=True)
    qm.close()


async def test_many_waiters_of_one_metatile_leave_at_their_deadlines(tmp_path):
    """20,000 waits for one metatile, all past their deadline: each leaves on its own (no task each, no
    list scan), the metatile is given up once, nothing is left behind."""
    qm = make_qm(tmp_path, max_waits=30_000, max_waits_per_account=20_000)
    deadline = time.time() + 0.5
    tasks = [asyncio.create_task(qm.request("18/0/0", user="a", deadline=deadline)) for _ in range(20_000)]
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), HANG)
    assert {r.id for r in results} == {"render_timeout"}
    assert qm.waiting == 0 and qm.waiters == {} and qm.render_waiters.by_account == {}
    assert qm.queue.queued_count() == 0 and qm.stats.counters["abandoned_dropped"] == 1
    qm.close()
