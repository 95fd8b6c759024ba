"""An example unit with one endpoint per outcome the CLI must handle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from qbroker import RequestContext, RequestError, RequestFailed, Unit, Warn


@dataclass
class Example:
    unit: Unit
    alerts: list[Any] = field(default_factory=list)


@pytest.fixture
async def example(make_unit: Any) -> Example:
    unit: Unit = await make_unit("clitest.example")
    example = Example(unit)

    @unit.rpc("clitest.echo")
    async def echo(text: str, times: int = 1) -> dict[str, Any]:
        return {"text": text * times}

    @unit.rpc("clitest.types")
    async def types(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        # Reports what arrived and as which JSON type, to check key=value parsing end to end.
        return {"params": body, "types": {k: type(v).__name__ for k, v in body.items()}, "debug": ctx.debug}

    @unit.rpc("clitest.string")
    async def string() -> str:
        return "plain text"

    @unit.rpc("clitest.boom")
    async def boom() -> None:
        raise RequestError("db_down", "database unavailable")

    @unit.rpc("clitest.bad")
    async def bad() -> None:
        raise RequestFailed("bad_tile", "tile out of range")

    @unit.rpc("clitest.warn")
    async def warn() -> Warn:
        return Warn({"done": 1}, "partial", "only half done")

    @unit.rpc("clitest.crash")
    async def crash() -> None:
        raise ZeroDivisionError("division by zero")

    @unit.rpc("clitest.slow")
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "late"

    tiles = unit.commands("clitest.tiles")

    @tiles.command("stats")
    async def stats() -> dict[str, Any]:
        return {"queued": 0}

    @tiles.command("render")
    async def render(tile: str, zoom: int, tiles: list[str] | None = None) -> dict[str, Any]:
        return {"tile": tile, "zoom": zoom, "tiles": tiles}

    @unit.on_alert("clitest.hello")
    async def hello(body: Any) -> dict[str, Any]:
        example.alerts.append(body)
        return {"hello": body.get("name") if isinstance(body, dict) else body}

    @unit.on_alert("clitest.notice")
    async def notice(body: Any) -> None:
        example.alerts.append(body)

    await unit.start()
    return example
