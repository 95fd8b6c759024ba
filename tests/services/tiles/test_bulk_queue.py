"""Bulk pre-rendering in the queuemaster without the bus: the bulk class below every other, Tirex-style
limits on the render threads background and bulk work may take, raising, withdrawing, persistence."""

import asyncio

import pytest

from qbroker import RequestError
from services.tiles.queuemaster.buckets import BucketLimits
from services.tiles.queuemaster.bulk import bulk_render, cancel_bulk
from services.tiles.renderer.worker import render_metatile
from services.toposm.messages import BulkRenderRequest, CancelBulkRequest, RenderedRequest
from services.toposm.tilemath import Metatile

from .test_queuemaster_core import make_qm, register, requested


async def bulk_requested(qm, metatile, user=None, **kw):
    """Start a ``bulk`` request (from ``user``'s account); return its task once its waiter is in place."""
    qm.work_available.clear()
    task = asyncio.create_task(bulk_render(qm, BulkRenderRequest(metatile=metatile, **kw), user))
    await asyncio.wait_for(qm.work_available.wait(), 10)
    return task


def finish(qm, m, status="ok"):
    qm.rendered(RenderedRequest(metatile=str(m), status=status, reason=None if status == "ok" else "broken"))


async def test_bulk_comes_after_requests_and_expirations(tmp_path):
    qm = make_qm(tmp_path)
    expired = Metatile(12, 5, 5)
    render_metatile("testpattern", str(tmp_path / "tiles"), str(expired))
    bulk = await bulk_requested(qm, "12/1/1")
    qm.expire("12/40/40", strict=False)
    missing = await requested(qm, "12/80/80")
    thread = register(qm)
    order = []
    for _ in range(3):
        [(t, m)] = qm.next_assignments()
        assert t is thread
        order.append(m)
        finish(qm, m)
    assert order == [Metatile(12, 10, 10), expired, Metatile(12, 1, 1)]
    assert (await bulk) == {"command": "rendered", "metatile": "12/1/1", "skipped": False}
    assert (await missing)["metatile"] == "12/10/10"


async def test_strategies_missing_and_important_never_pre_render(tmp_path):
    qm = make_qm(tmp_path)
    task = await bulk_requested(qm, "12/1/1")
    register(qm, 0, strategy="missing")
    register(qm, 1, strategy="important")
    assert qm.next_assignments() == []
    register(qm, 2, strategy="by_zoom")
    [(thread, m)] = qm.next_assignments()
    assert thread.threadid == 2 and m == Metatile(12, 1, 1)
    task.cancel()


async def test_bulk_takes_at_most_its_threads_and_leaves_the_rest_for_requests(tmp_path):
    qm = make_qm(tmp_path, buckets=BucketLimits(bulk=1))
    tasks = [await bulk_requested(qm, f"12/{i}/0") for i in range(3)]
    threads = [register(qm, i) for i in range(3)]
    [(first, m1)] = qm.next_assignments()  # one thread on bulk; the other two stay idle
    assert m1 == Metatile(12, 0, 0)
    assert qm.next_assignments() == []
    assert qm.describe()["queues"]["rendering_by_class"] == {"bulk": 1}
    request = await requested(qm, "12/800/800")
    [(second, m2)] = qm.next_assignments()  # an idle thread was there for it
    assert second is not first and m2 == Metatile(12, 100, 100)
    # the bulk thread finishes and takes the next bulk metatile in the answer; still one at a time
    answer = qm.rendered(RenderedRequest(metatile=str(m1), hostname="h", pid=1, threadid=first.threadid, next=True))
    assert answer["render"] == "12/1/0"
    assert qm.next_assignments() == []
    finish(qm, m2)
    assert (await request)["metatile"] == "12/100/100"
    assert sum(1 for t in threads if t.metatile is not None) == 1
    for task in tasks:
        task.cancel()


async def test_background_limit_counts_expired_and_bulk_together(tmp_path):
    qm = make_qm(tmp_path, render_missing_expired=True, buckets=BucketLimits(background=1))
    task = await bulk_requested(qm, "12/1/1")
    qm.expire("12/40/40", strict=False)
    for i in range(3):
        register(qm, i)
    [(_, m)] = qm.next_assignments()
    assert m == Metatile(12, 5, 5)  # the expired one first
    assert qm.next_assignments() == []  # the bulk one waits: the background bucket is full
    finish(qm, m)
    [(_, m)] = qm.next_assignments()
    assert m == Metatile(12, 1, 1)
    finish(qm, m)
    assert (await task)["skipped"] is False


async def test_requests_and_expiries_raise_bulk_metatiles_and_cancel_leaves_them(tmp_path):
    qm = make_qm(tmp_path)
    rendered_before = Metatile(12, 2, 2)
    render_metatile("testpattern", str(tmp_path / "tiles"), str(rendered_before))
    tasks = {m: await bulk_requested(qm, m) for m in ("12/1/1", "12/2/2", "12/3/3")}
    assert qm.queue.bulk == 3
    out = qm.expire("12/16/16", strict=False)  # 12/2/2 expired: background now
    assert out["raised"] == 1 and qm.queue.state_of(rendered_before) == "background"
    request = await requested(qm, "12/8/8")  # 12/1/1 requested: missing now
    assert qm.queue.state_of(Metatile(12, 1, 1)) == "missing" and qm.queue.bulk == 1
    answer = cancel_bulk(qm, CancelBulkRequest(metatiles=list(tasks)))
    assert answer == {"command": "cancelled", "metatiles": 3, "withdrawn": 1}
    with pytest.raises(RequestError) as info:
        await tasks["12/3/3"]
    assert info.value.id == "bulk_cancelled" and info.value.detail == "metatile 12/3/3"
    assert qm.queue.state_of(Metatile(12, 3, 3)) is None
    register(qm)
    for _ in range(2):
        [(_, m)] = qm.next_assignments()
        finish(qm, m)
    assert (await request)["metatile"] == "12/1/1" and (await tasks["12/1/1"])["metatile"] == "12/1/1"
    assert (await tasks["12/2/2"])["metatile"] == "12/2/2"


async def test_cancel_withdraws_only_what_the_callers_own_bulk_requests_wait_for(tmp_path):
    """Whoever may send ``cancel``, one account's render-list cannot stop another's: a metatile is withdrawn
    only when every bulk request waiting for it is the caller's."""
    qm = make_qm(tmp_path)
    alices = await bulk_requested(qm, "12/4/4", user="alice")
    shared = [await bulk_requested(qm, "12/5/5", user=user) for user in ("alice", "bob")]
    assert cancel_bulk(qm, CancelBulkRequest(metatiles=["12/4/4", "12/5/5"]), "bob")["withdrawn"] == 0
    assert qm.queue.bulk == 2 and not alices.done()
    assert cancel_bulk(qm, CancelBulkRequest(metatiles=["12/4/4", "12/5/5"]), "alice")["withdrawn"] == 1
    with pytest.raises(RequestError) as info:
        await alices
    assert info.value.id == "bulk_cancelled" and qm.queue.state_of(Metatile(12, 4, 4)) is None
    assert qm.queue.state_of(Metatile(12, 5, 5)) == "bulk"  # bob still waits for it
    shared[1].cancel()  # bob's render-list stopped without a cancel: alice alone waits now
    await asyncio.gather(shared[1], return_exceptions=True)
    assert cancel_bulk(qm, CancelBulkRequest(metatiles=["12/5/5"]), "alice")["withdrawn"] == 1
    with pytest.raises(RequestError):
        await shared[0]
    assert qm.bulk_waiting == {}


async def test_missing_only_skips_what_was_rendered_and_failures_answer_the_bulk_request(tmp_path):
    qm = make_qm(tmp_path)
    render_metatile("testpattern", str(tmp_path / "tiles"), "12/2/2")
    skipped = await bulk_render(qm, BulkRenderRequest(metatile="12/2/2", missing_only=True))
    assert skipped == {"command": "rendered", "metatile": "12/2/2", "skipped": True}
    assert qm.queue.queued_count() == 0
    forced = await bulk_requested(qm, "12/2/2")  # without missing_only: rendered again
    failing = await bulk_requested(qm, "12/3/3", missing_only=True, priority="background")
    assert qm.queue.state_of(Metatile(12, 3, 3)) == "background"
    register(qm)
    [(_, m)] = qm.next_assignments()
    assert m == Metatile(12, 3, 3)  # background before bulk
    finish(qm, m, "error")
    with pytest.raises(RequestError) as info:
        await failing
    assert info.value.id == "render_failed"
    [(_, m)] = qm.next_assignments()
    finish(qm, m)
    assert (await forced)["skipped"] is False
    assert qm.stats.counters["bulk_requested"] == 3 and qm.stats.counters["bulk_skipped"] == 1


async def test_bulk_queue_survives_a_restart(tmp_path):
    qm = make_qm(tmp_path)
    task = await bulk_requested(qm, "12/1/1")
    register(qm)
    qm.fail_waiters()
    with pytest.raises(RequestError):
        await task
    qm.close()
    again = make_qm(tmp_path)
    assert again.queue.bulk == 1 and again.queue.state_of(Metatile(12, 1, 1)) == "bulk"
    assert again.describe()["queues"]["bulk"] == 1
    again.close()
