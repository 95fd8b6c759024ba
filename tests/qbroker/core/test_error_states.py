"""Status ``ok`` with an id cancels an error state (the seed's "message board" meaning), on replies and alerts."""

from __future__ import annotations

import asyncio

from harness import HANG
from qbroker import Cleared, ErrorInfo, RequestContext
from tests.conftest import MakeUnit


async def test_a_reply_and_an_alert_can_say_an_error_state_is_over(make_unit: MakeUnit, transport: str) -> None:
    server, client = await make_unit("test.board"), await make_unit("test.client")
    board: dict[tuple[str, str], str] = {("db_down", "orders"): "error"}
    seen: asyncio.Queue[ErrorInfo | None] = asyncio.Queue()

    @server.rpc("test.repair")
    async def repair() -> Cleared:
        return Cleared({"repaired": True}, "db_down", "database reachable again", part="orders")

    @server.on_alert("orders.health")
    async def health(ctx: RequestContext) -> None:
        if ctx.error is not None and ctx.error.status == "ok":
            board.pop((ctx.error.id, ctx.error.part), None)
        await seen.put(ctx.error)

    await server.start()
    await client.start()
    reply = await client.call_reply("test.repair", {}, timeout=HANG)
    assert reply.body == {"repaired": True} and reply.warning is None
    assert reply.cleared is not None and (reply.cleared.id, reply.cleared.part) == ("db_down", "orders")
    assert await client.call("test.repair", {}, timeout=HANG) == {"repaired": True}  # ok: nothing raised

    await client.alert("orders.health", {"checked": "now"})
    assert await asyncio.wait_for(seen.get(), HANG) is None  # a plain alert carries no error element
    await client.alert("orders.health", None, error=ErrorInfo(status="ok", id="db_down", part="orders"))
    cleared = await asyncio.wait_for(seen.get(), HANG)
    assert cleared is not None and cleared.status == "ok" and board == {}
