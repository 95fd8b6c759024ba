"""RQ DELIVERED / UNDELIVERED: an opt-in notice when a server picks a request up, and errors that say the
request died without being processed."""

from __future__ import annotations

import asyncio

import pytest

from harness import HANG
from qbroker import NoServer, Reply, RequestContext, RequestError
from tests.conftest import MakeUnit


async def test_a_delivered_notice_comes_before_the_reply(make_unit: MakeUnit, transport: str) -> None:
    server, client = await make_unit("test.server"), await make_unit("test.client")
    release, delivered = asyncio.Event(), asyncio.Event()
    notices: list[Reply] = []

    @server.rpc("t.slow")
    async def slow(fail: bool = False) -> str:
        await release.wait()
        if fail:
            raise RequestError("disk_full", "no space left")
        return "done"

    await server.start()
    await client.start()

    def on_delivered(notice: Reply) -> None:
        notices.append(notice)
        delivered.set()

    call = asyncio.create_task(client.call("t.slow", {}, timeout=HANG, on_delivered=on_delivered))
    await asyncio.wait_for(delivered.wait(), HANG)
    assert not call.done()  # the server has it and is still working on it
    assert notices[0].header.app_id == server.uuid and notices[0].body is None
    release.set()
    assert await call == "done"
    assert len(notices) == 1

    with pytest.raises(RequestError) as processed:  # it reached a server, which failed it
        await client.call("t.slow", {"fail": True}, timeout=HANG, on_delivered=lambda _: None)
    assert not processed.value.undelivered
    with pytest.raises(NoServer) as nobody:  # it never reached a server: an undelivered notice, at once
        await client.call("t.nobody", {}, timeout=HANG, on_delivered=notices.append)
    assert nobody.value.undelivered and len(notices) == 1  # and no delivered notice for it


async def test_no_notice_unless_asked(make_unit: MakeUnit, transport: str) -> None:
    server, client = await make_unit("test.server"), await make_unit("test.client")
    seen_headers: list[dict[str, object]] = []

    @server.rpc("t.echo")
    async def echo(text: str, ctx: RequestContext) -> str:
        seen_headers.append(dict(ctx.headers))
        return text

    await server.start()
    await client.start()
    assert await client.call("t.echo", {"text": "hi"}, timeout=HANG) == "hi"
    assert "notify" not in seen_headers[0]
