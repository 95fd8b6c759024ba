"""Bulk pre-rendering (``toposm-render-list``): the ``bulk`` and ``cancel`` commands.

renderd's ``render_list`` sends each metatile of an area as a bulk request and waits for its answer, with a
few requests in flight; so does ``toposm-render-list``. A ``bulk`` request queues its metatile in the bulk
class (below every other, ``render_queue``), or ``background`` when asked, and is answered when the metatile
is rendered, like ``render``; a stopped render-list withdraws what it queued and is still waiting
(``cancel``), so stopping it stops its work. A request or an expiry raises a bulk-queued metatile as it does
any other, and a raised one is never withdrawn. A ``cancel`` withdraws only the metatiles whose waiting bulk
requests all came from the caller's own account (the AMQP ``user_id`` RabbitMQ checked): one account's
render-list cannot stop another's, whoever may send ``cancel`` (``TOPOSM_BULK_USERS`` or not).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from services.toposm.contract import Command
from services.toposm.messages import BulkRenderRequest, CancelBulkRequest
from services.toposm.tilemath import parse_metatile

from .state_machine import Queuemaster, request_deadline


async def bulk_render(qm: Queuemaster, req: BulkRenderRequest, user: str | None = None) -> dict[str, Any]:
    """Queue the metatile (unless ``missing_only`` and it was rendered before) and answer once it is
    rendered: ``{"command": "rendered", "metatile", "skipped"}``."""
    m = qm.metatile(req.metatile)
    qm.stats.count("bulk_requested")
    answer = {"command": Command.RENDERED, "metatile": str(m), "skipped": False}
    if req.missing_only and qm.tiles.metatile_exists(m):
        qm.stats.count("bulk_skipped")
        return {**answer, "skipped": True}
    qm.check_room(user)  # before queueing: a refused request leaves no trace in the queue
    waiting = qm.bulk_waiting.setdefault(m, Counter())
    waiting[user] += 1
    try:
        if qm.queue.state_of(m) != "rendering":  # a render in flight answers this request too
            qm.queue.add(m, req.priority)  # merges with what is queued already, never lowers it
        return {**answer, **await qm.wait_for(m, request_deadline.get(), user)}
    finally:
        waiting[user] -= 1
        if waiting[user] <= 0:
            del waiting[user]
        if not waiting and qm.bulk_waiting.get(m) is waiting:
            del qm.bulk_waiting[m]


def cancel_bulk(qm: Queuemaster, req: CancelBulkRequest, user: str | None = None) -> dict[str, Any]:
    """Withdraw those of ``req.metatiles`` still bulk-queued that only ``user``'s bulk requests wait for."""
    metatiles = [parse_metatile(text) for text in req.metatiles]
    withdrawn = qm.queue.withdraw_bulk([m for m in metatiles if set(qm.bulk_waiting.get(m, ())) == {user}])
    for m in withdrawn:
        qm.render_waiters.cancel(m)
    qm.stats.count("bulk_withdrawn", len(withdrawn))
    return {"command": Command.CANCELLED, "metatiles": len(req.metatiles), "withdrawn": len(withdrawn)}
