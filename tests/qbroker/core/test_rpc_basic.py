from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from pydantic import BaseModel

from harness import HANG
from qbroker import (
    HandlerCrashed,
    InvalidParams,
    NoServer,
    NotStarted,
    RequestContext,
    RequestError,
    RequestFailed,
    UnknownCommand,
    Warn,
)
from tests.conftest import MakeUnit


async def test_call_and_reply(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.echo")
    async def echo(text: str, times: int = 1) -> dict[str, str]:
        return {"text": text * times}

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.echo", {"text": "ab", "times": 3}) == {"text": "ababab"}
    assert await client.call("t.echo", {"text": "x"}) == {"text": "x"}


async def test_context_carries_header(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    seen: list[RequestContext] = []

    @server.rpc("t.ctx")
    async def ctx_handler(ctx: RequestContext) -> str:
        seen.append(ctx)
        return ctx.app_id or ""

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.ctx", {}, debug=True) == client.uuid
    assert seen[0].name == "t.ctx"
    assert seen[0].reply_to == client.uuid
    assert seen[0].debug is True
    assert seen[0].deadline is not None and seen[0].deadline > time.time()


async def test_500_concurrent_calls_keep_their_correlation(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.square")
    async def square(n: int) -> int:
        await asyncio.sleep(0.001 * (n % 7))  # finish out of order
        return n * n

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    results = await asyncio.gather(*(client.call("t.square", {"n": n}, timeout=30) for n in range(500)))
    assert results == [n * n for n in range(500)]
    assert len(client.pending) == 0


async def test_unroutable_request_is_answered_no_server(make_unit: MakeUnit) -> None:
    """The dead-letter path answers at once (bench/rpc.py measures how fast); our own deadline would
    raise CallTimeout instead, so NoServer proves the answer came from the bus."""
    client = await make_unit("test.client")
    await client.start()
    with pytest.raises(NoServer) as info:
        await client.call("t.nobody.serves.this", {}, timeout=60)
    assert info.value.status == "fail"
    assert info.value.message == "no server for the request's name"  # fixed per (status, id, part)
    assert "t.nobody.serves.this" in (info.value.detail or "")


async def test_validation_errors_name_the_fields(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.typed")
    async def typed(zoom: int, tile: str) -> str:
        return f"{zoom}/{tile}"

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    with pytest.raises(InvalidParams) as info:
        await client.call("t.typed", {"zoom": "high"})
    assert info.value.status == "fail"
    assert info.value.message == "the request's parameters are not valid"
    assert "zoom" in (info.value.detail or "") and "tile" in (info.value.detail or "")
    with pytest.raises(InvalidParams, match="zom"):
        await client.call("t.typed", {"zom": 1, "zoom": 1, "tile": "a"})
    with pytest.raises(InvalidParams, match="expected a JSON object"):
        await client.call("t.typed", [1, 2])
    assert await client.call("t.typed", {"zoom": 3, "tile": "a"}) == "3/a"


class RenderParams(BaseModel):
    tile: str
    priority: int = 0


async def test_model_and_body_parameters(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.model")
    async def model(params: RenderParams) -> dict[str, object]:
        return params.model_dump()

    @server.rpc("t.body")
    async def whole(body: list[int]) -> int:
        return sum(body)

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.model", {"tile": "1/0/0"}) == {"tile": "1/0/0", "priority": 0}
    assert await client.call("t.body", [1, 2, 3]) == 6
    with pytest.raises(InvalidParams, match="tile"):
        await client.call("t.model", {"priority": 1})


async def test_command_endpoint(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")
    qm = server.commands("t.queuemaster")

    @qm.command("stats")
    async def stats() -> dict[str, int]:
        return {"queued": 4}

    @qm.command("render")
    async def render(tile: str) -> dict[str, str]:
        return {"command": "rendered", "tile": tile}

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.queuemaster", {"command": "stats"}) == {"queued": 4}
    assert await client.call("t.queuemaster", {"command": "render", "tile": "2/1/1"}) == {
        "command": "rendered",
        "tile": "2/1/1",
    }
    with pytest.raises(UnknownCommand, match="render, stats"):
        await client.call("t.queuemaster", {"command": "explode"})
    with pytest.raises(InvalidParams, match="command"):
        await client.call("t.queuemaster", {"tile": "1/0/0"})
    with pytest.raises(InvalidParams, match="tile"):
        await client.call("t.queuemaster", {"command": "render"})


class _Request(BaseModel):
    """The common base a handler serving several commands is annotated with."""


class _Zoom(_Request):
    zoom: int


class _Tile(_Request):
    tile: str


async def test_command_request_model_named_at_registration(make_unit: MakeUnit) -> None:
    """One handler function serves two commands, each validated against the model given as ``request=``,
    not against the base class its parameter is annotated with."""
    server = await make_unit("test.server")
    qm = server.commands("t.models")

    def handler_for(command: str) -> Callable[..., Awaitable[dict[str, object]]]:
        async def handle(request: _Request, ctx: RequestContext) -> dict[str, object]:
            return {"command": command, "model": type(request).__name__, **request.model_dump()}

        return handle

    qm.command("zoom", request=_Zoom)(handler_for("zoom"))
    qm.command("tile", request=_Tile)(handler_for("tile"))
    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.models", {"command": "zoom", "zoom": 3}) == {
        "command": "zoom",
        "model": "_Zoom",
        "zoom": 3,
    }
    assert await client.call("t.models", {"command": "tile", "tile": "1/0/0"}) == {
        "command": "tile",
        "model": "_Tile",
        "tile": "1/0/0",
    }
    with pytest.raises(InvalidParams, match="zoom"):
        await client.call("t.models", {"command": "zoom", "tile": "1/0/0"})
    assert qm.describe()["commands"]["tile"]["properties"] == {"tile": {"title": "Tile", "type": "string"}}


def test_command_request_model_needs_one_parameter() -> None:
    from qbroker.handlers import Handler

    async def two(a: int, b: int) -> None: ...

    with pytest.raises(TypeError, match="exactly one parameter"):
        Handler(two, "t:two", request=_Zoom)


class TileOutOfRange(RequestFailed):
    error_id = "tile_out_of_range"


class Unlisted(Exception):
    """Neither built in nor registered: it crosses the bus as error/unhandled, never as itself."""


class StoreMissing(Exception):
    """A user type registered with register_exception: it crosses the bus as itself."""


async def test_remote_exceptions_round_trip(make_unit: MakeUnit) -> None:
    from qbroker import register_error

    register_error(TileOutOfRange)
    server = await make_unit("test.server")

    @server.rpc("t.raises")
    async def raises(kind: str) -> None:
        if kind == "registered":
            raise TileOutOfRange("tile 3/9/9 is outside zoom 3")
        if kind == "error":
            raise RequestError("db_down", "database unavailable")
        raise Unlisted("boom")

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    with pytest.raises(TileOutOfRange) as registered:
        await client.call("t.raises", {"kind": "registered"})
    assert registered.value.part == "t.raises"
    assert registered.value.message == "tile 3/9/9 is outside zoom 3"
    with pytest.raises(RequestError) as error:
        await client.call("t.raises", {"kind": "error"})
    assert (error.value.status, error.value.id) == ("error", "db_down")
    with pytest.raises(HandlerCrashed) as crashed:
        await client.call("t.raises", {"kind": "other"})
    assert crashed.value.message == "the handler raised an unexpected exception"
    assert crashed.value.detail == "unhandled Unlisted in t.raises"
    assert crashed.value.trace is None
    with pytest.raises(HandlerCrashed) as debugged:
        await client.call("t.raises", {"kind": "other"}, debug=True)
    assert debugged.value.trace is not None and "Unlisted: boom" in debugged.value.trace


async def test_warn_reply_gives_result_and_warning(make_unit: MakeUnit) -> None:
    server = await make_unit("test.server")

    @server.rpc("t.warns")
    async def warns() -> Warn:
        return Warn({"tiles": 3}, "stale_index", "the tile index is being rebuilt")

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.warns") == {"tiles": 3}
    reply = await client.call_reply("t.warns")
    assert reply.body == {"tiles": 3}
    assert reply.warning is not None
    assert (reply.warning.id, reply.warning.message) == ("stale_index", "the tile index is being rebuilt")


async def test_wrong_state_errors(make_unit: MakeUnit) -> None:
    unit = await make_unit("test.client")
    with pytest.raises(NotStarted, match="start"):
        await unit.call("t.echo", {})
    await unit.start()
    with pytest.raises(NotStarted):
        unit.rpc("t.late")


async def test_a_handler_may_call_and_alert_while_its_unit_is_still_starting(make_unit: MakeUnit) -> None:
    """A request already queued is handled as soon as the endpoint's consumer attaches, inside start():
    its handler's calls and alerts must work then, not raise NotStarted."""
    first = await make_unit("test.server")

    @first.rpc("t.queued")
    async def unused() -> None: ...

    await first.start()  # declares the shared queue, then leaves it with nobody consuming
    await first.stop()
    client = await make_unit("test.client")
    heard: asyncio.Queue[object] = asyncio.Queue()

    @client.on_alert("t.handled")
    async def on_handled(body: object) -> None:
        await heard.put(body)

    await client.start()
    await client.cast("t.queued", {"n": 1})
    server = await make_unit("test.server")
    entered = asyncio.Event()
    outcome: asyncio.Queue[str] = asyncio.Queue()

    @server.rpc("t.queued")
    async def queued(n: int) -> None:
        entered.set()
        try:
            await server.alert("t.handled", {"n": n, "state": server.state})
            await outcome.put("alerted")
        except Exception as exc:  # the old behaviour: NotStarted
            await outcome.put(repr(exc))

    @server.on_connected
    async def hold_start_until_the_handler_runs(connection: object) -> None:
        await asyncio.wait_for(entered.wait(), HANG)

    await server.start()
    assert await asyncio.wait_for(outcome.get(), HANG) == "alerted"
    assert await asyncio.wait_for(heard.get(), HANG) == {"n": 1, "state": "starting"}


async def test_native_exceptions_by_allow_list(make_unit: MakeUnit) -> None:
    from qbroker import register_exception

    register_exception(StoreMissing, "test.store_missing")
    server = await make_unit("test.server")

    @server.rpc("t.native")
    async def native(kind: str) -> None:
        if kind == "key":
            raise KeyError("tile 9/1/2")
        if kind == "value":
            raise ValueError(f"bad zoom {kind}")
        if kind == "permission":
            raise PermissionError("not yours")
        if kind == "registered":
            raise StoreMissing("/srv/store")
        raise Unlisted("no")

    await server.start()
    client = await make_unit("test.client")
    await client.start()
    with pytest.raises(KeyError) as key:
        await client.call("t.native", {"kind": "key"})
    assert isinstance(key.value, RequestError)  # still a qbroker error: `except QBrokerError` catches it
    assert (key.value.id, key.value.message, key.value.detail) == (
        "python.KeyError",
        "KeyError in t.native",
        "tile 9/1/2",
    )
    # The seed: one (status, id, part), one message; what differs per request is the detail.
    with pytest.raises(ValueError) as value:
        await client.call("t.native", {"kind": "value"})
    assert value.value.message == "ValueError in t.native" and value.value.detail == "bad zoom value"
    with pytest.raises(PermissionError):
        await client.call("t.native", {"kind": "permission"})
    with pytest.raises(StoreMissing) as registered:
        await client.call("t.native", {"kind": "registered"})
    assert registered.value.id == "test.store_missing" and registered.value.detail == "/srv/store"
    with pytest.raises(HandlerCrashed):  # not allowed: no type is made from a name on the wire
        await client.call("t.native", {"kind": "other"})


def test_no_type_is_made_from_an_unknown_name_on_the_wire() -> None:
    from qbroker.errors import ErrorInfo, error_from_info

    forged = error_from_info(ErrorInfo(status="error", id="python.SystemExit", part="x", message="m"))
    assert type(forged) is RequestError and not isinstance(forged, SystemExit)
    forged = error_from_info(ErrorInfo(status="error", id="os.system", part="x", message="m"))
    assert type(forged) is RequestError
    # A known id with the wrong status is not trusted either.
    assert type(error_from_info(ErrorInfo(status="fail", id="python.KeyError", message="m"))) is RequestFailed
