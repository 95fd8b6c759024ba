"""The middleware chain (qbroker.middleware): user links in their documented order around the built-ins
and the handler, refusing a request, and the same chain around alert listeners."""

from __future__ import annotations

from typing import Any

import pytest

from harness import eventually
from qbroker import RequestContext, RequestFailed
from qbroker.middleware import Middleware, Next, Outcome, refuse
from tests.conftest import MakeUnit


class Recorder(Middleware):
    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        self.seen.append(f"{self.name}> {ctx.kind} {ctx.part}")
        result, error = await call_next(ctx, body)
        self.seen.append(f"<{self.name} {'ok' if error is None else error.id}")
        return result, error


class OnlyAllowed(Middleware):
    async def handle(self, call_next: Next, ctx: RequestContext, body: Any) -> Outcome:
        if isinstance(body, dict) and body.get("who") != "friend":
            return refuse(RequestFailed("forbidden", f"{ctx.part}: friends only"), ctx.part or "")
        return await call_next(ctx, body)


async def test_links_run_in_order_around_the_handler(make_unit: MakeUnit, transport: str) -> None:
    seen: list[str] = []
    server, client = await make_unit("test.mw.server"), await make_unit("test.mw.client")

    @server.rpc("mw.echo")
    async def echo(who: str) -> str:
        seen.append("handler")
        return who

    server.use(Recorder("A", seen))
    server.use(Recorder("B", seen))
    server.use(Recorder("C", seen), inner=True)
    await server.start()
    await client.start()
    assert await client.call("mw.echo", {"who": "friend"}) == "friend"
    assert seen == ["A> rpc mw.echo", "B> rpc mw.echo", "C> rpc mw.echo", "handler", "<C ok", "<B ok", "<A ok"]
    seen.clear()
    with pytest.raises(RequestFailed, match="invalid_params"):
        await client.call("mw.echo", {"who": {"not": "a string"}})
    assert seen == [
        "A> rpc mw.echo",
        "B> rpc mw.echo",
        "C> rpc mw.echo",
        "<C invalid_params",
        "<B invalid_params",
        "<A invalid_params",
    ]  # every link sees the handler's outcome


async def test_a_middleware_refuses_before_the_handler_runs(make_unit: MakeUnit, transport: str) -> None:
    ran: list[str] = []
    seen: list[str] = []
    server, client = await make_unit("test.mw.guarded"), await make_unit("test.mw.stranger")

    @server.rpc("mw.secret")
    async def secret(who: str) -> str:
        ran.append(who)
        return "the secret"

    server.use(Recorder("outer", seen))
    server.use(OnlyAllowed())
    await server.start()
    await client.start()
    with pytest.raises(RequestFailed, match="friends only") as refused:
        await client.call("mw.secret", {"who": "stranger"})
    assert refused.value.id == "forbidden" and ran == []
    assert seen == ["outer> rpc mw.secret", "<outer forbidden"]  # the refusal is an outcome, not an exception
    assert await client.call("mw.secret", {"who": "friend"}) == "the secret"


async def test_alert_listeners_run_inside_the_chain(make_unit: MakeUnit, transport: str) -> None:
    seen: list[str] = []
    heard: list[str] = []
    listener, sender = await make_unit("test.mw.listener"), await make_unit("test.mw.sender")

    @listener.on_alert("mw.news.#")
    async def news(text: str) -> None:
        heard.append(text)

    listener.use(Recorder("L", seen))
    await listener.start()
    await sender.start()
    await sender.alert("mw.news.today", {"text": "hello"})
    await eventually(lambda: len(seen) == 2)
    assert heard == ["hello"] and seen == ["L> alert mw.news.today", "<L ok"]
