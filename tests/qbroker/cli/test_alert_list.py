"""``qbroker alert`` (plain, text, --gather) and ``qbroker list`` against a running example unit."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from harness import eventually
from qbroker import Cleared, RequestContext
from tests.qbroker.cli.conftest import Example
from tests.qbroker.cli.helpers import run_cli


async def test_alert_publishes_json_and_text(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "alert", "clitest.notice", "tile=14/1/2", "zoom=14")
    assert (result.code, result.stdout) == (0, "")
    await eventually(lambda: {"tile": "14/1/2", "zoom": 14} in example.alerts)
    text = await run_cli(amqp_url, "alert", "clitest.notice", "--text", "14/1/2;14/1/3")
    assert text.code == 0
    await eventually(lambda: "14/1/2;14/1/3" in example.alerts)


async def test_alert_gather_prints_each_reply(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "alert", "clitest.hello", "name=Ada", "--gather", "--timeout", "1.5")
    assert result.code == 0, result.stderr
    replies = [orjson.loads(line) for line in result.stdout.splitlines()]  # JSON lines when piped
    assert replies == [{"hello": "Ada"}]
    assert "1 reply" in result.stderr


async def test_alert_gather_max_stops_early(amqp_url: str, example: Example) -> None:
    # The gather's own deadline (600 s) is far beyond run_cli's ceiling (60 s): only --max can end it in time.
    result = await run_cli(amqp_url, "alert", "qbroker.ping", "--gather", "--max", "1", "--timeout", "600", timeout=60)
    assert result.code == 0
    assert len(result.stdout.splitlines()) == 1
    assert orjson.loads(result.stdout)["uuid"] == example.unit.uuid  # the CLI's own reply is not counted


async def test_alert_usage_problems(amqp_url: str) -> None:
    both = await run_cli(amqp_url, "alert", "x.y", "--text", "hi", "a=1")
    assert both.code == 64 and "--text" in both.stderr
    gather_text = await run_cli(amqp_url, "alert", "x.y", "--text", "hi", "--gather")
    assert gather_text.code == 64


async def test_list_table(amqp_url: str, example: Example) -> None:
    result = await run_cli(amqp_url, "list", "--timeout", "1")
    assert result.code == 0, result.stderr
    out = result.stdout
    assert "clitest.example" in out and example.unit.uuid in out
    assert "clitest.echo" in out and "clitest.tiles [render, stats]" in out
    assert "qbroker.cli" not in out  # the CLI's own unit is not listed
    assert "\x1b[" not in out


async def test_list_schemas_and_json(amqp_url: str, example: Example) -> None:
    schemas = await run_cli(amqp_url, "list", "--schemas", "--timeout", "1")
    assert schemas.code == 0
    assert '"times"' in schemas.stdout and "clitest.echo.params" in schemas.stdout
    assert "render" in schemas.stdout and '"zoom"' in schemas.stdout
    as_json = await run_cli(amqp_url, "list", "--json", "--timeout", "1")
    units = {u["uuid"]: u for u in as_json.json()}
    mine = units[example.unit.uuid]
    assert mine["app"] == "clitest.example"
    assert mine["endpoints"]["clitest.echo"]["schema"]["required"] == ["text"]
    assert set(mine["endpoints"]["clitest.tiles"]["commands"]) == {"render", "stats"}


async def test_list_no_broker_exits_three() -> None:
    result = await run_cli("amqp://guest:guest@127.0.0.1:1/", "list")
    assert result.code == 3 and "no broker reachable" in result.stderr


async def test_alert_reports_and_clears_an_error_state(amqp_url: str, make_unit: Any) -> None:
    unit = await make_unit("clitest.board")
    seen: asyncio.Queue[Any] = asyncio.Queue()

    @unit.on_alert("clitest.health")
    async def health(ctx: RequestContext) -> None:
        await seen.put(ctx.error)

    @unit.rpc("clitest.repair")
    async def repair() -> Cleared:
        return Cleared({"repaired": True}, "db_down", "database reachable again", part="orders")

    await unit.start()
    for status in ("error", "ok"):
        sent = await run_cli(
            amqp_url,
            "alert",
            "clitest.health",
            "--status",
            status,
            "--error-id",
            "db_down",
            "--part",
            "orders",
            "--message",
            "database unavailable",
        )
        assert sent.code == 0, sent.stderr
        error = await asyncio.wait_for(seen.get(), 60)
        assert (error.status, error.id, error.part) == (status, "db_down", "orders")
    repaired = await run_cli(amqp_url, "call", "clitest.repair")
    assert repaired.code == 0 and repaired.json() == {"repaired": True}
    assert "ok: clears db_down" in repaired.stderr
    for args in (
        ("--status", "ok"),
        ("--status", "bad", "--error-id", "x"),
        ("--status", "ok", "--error-id", "x", "--gather"),
    ):
        usage = await run_cli(amqp_url, "alert", "clitest.health", *args)
        assert usage.code == 64, (args, usage.stderr)
