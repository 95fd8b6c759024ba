"""toposm-web over HTTP when the queuemaster does not answer (tiles, placeholders, clicks), its favicon and
its access log (the Combined Log Format)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness import eventually
from services.web.app import STATIC
from services.web.main import parse_args
from services.web.same_origin import SECURITY_HEADERS
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import Web, start_web

PLACEHOLDER_TILE = (STATIC / "tile-unavailable.png").read_bytes()
FAVICON = STATIC / "favicon.ico"
NOT_RUNNING = "the queuemaster is not running (nobody serves toposm.queuemaster on the bus)"
# host ident user [time] "request" status bytes "referer" "user agent": what Apache's and nginx's combined write
COMBINED = re.compile(
    r'(?P<host>\S+) - - \[(?P<time>[^]]+)\] "(?P<request>(?:[^"\\]|\\x[0-9A-F]{2})*)" '
    r'(?P<status>\d{3}) (?P<bytes>\d+) "(?P<referer>[^"]*)" "(?P<agent>[^"]*)"'
)


async def get(url: str, **headers: str) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.read(), dict(response.headers)


async def test_favicon(web: Web) -> None:
    status, body, headers = await get(web.url + "/favicon.ico")
    assert status == 200 and headers["Content-Type"] == "image/x-icon" and body.startswith(b"\x00\x00\x01\x00")
    assert all(headers.get(name) == value for name, value in SECURITY_HEADERS.items()), headers


async def test_tiles_and_clicks_say_renders_are_unavailable_then_work_again(bus: TileBus, web: Web) -> None:
    # No queuemaster: a missing tile is refused at once with the reason in plain words, not after the
    # render timeout, and the map's own tile URL gets a placeholder instead of an error.
    status, body, headers = await get(web.url + "/tiles/5/3/4.png")
    assert status == 503 and body.decode() == f"503: renders unavailable: {NOT_RUNNING}\n", body
    assert headers["X-Tile-State"] == "unavailable" and headers["Retry-After"] == "10"
    status, body, headers = await get(web.url + "/tiles/5/3/4.png?placeholder=1&epoch=0")
    assert status == 200 and body == PLACEHOLDER_TILE and headers["Content-Type"] == "image/png"
    assert headers["Cache-Control"] == "no-store" and headers["X-Tile-State"] == "unavailable"
    async with aiohttp.ClientSession() as session:
        async with session.post(web.url + "/api/render", json={"tile": "5/3/4"}) as response:
            assert response.status == 503 and response.headers["Retry-After"] == "10"
            assert await response.json() == {"error": f"renders unavailable: {NOT_RUNNING}"}
    assert not (bus.tile_root / "5/3/4.png").exists()

    # Back: the first request after it answers is rendered, even before toposm-web's next poll would have
    # noticed (a request after a failed poll asks for a fresh one).
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    status, body, headers = await get(web.url + "/tiles/5/3/4.png?placeholder=1")
    assert status == 200 and headers["X-Tile-State"] == "missing" and body == (bus.tile_root / "5/3/4.png").read_bytes()


async def test_a_stopped_queuemaster_whose_queue_remains_is_unavailable_too(bus: TileBus, web: Web) -> None:
    """Its queue outlives it for a while: requests wait there until they expire (queue_timeout), which used
    to hold a tile request for the whole render timeout and answer 502 with the exception's text."""
    qm = bus.queuemaster()
    await wait_renderers(await bus.client(), 0)

    async def online() -> bool:
        async with aiohttp.ClientSession() as session, session.get(web.url + "/api/status") as response:
            return bool((await response.json())["queuemaster"]["online"])

    await eventually(online)
    qm.stop()
    status, body, headers = await get(web.url + "/tiles/6/1/1.png")
    assert status == 503 and headers["X-Tile-State"] == "unavailable", body
    assert body.decode().startswith("503: renders unavailable: the queuemaster "), body
    assert not re.search(r"queue_timeout|call_timeout|no_server|Error|NoServer", body.decode()), body


def combined_lines(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if COMBINED.fullmatch(line)]
    return [m.groupdict() for m in map(COMBINED.fullmatch, lines) if m]


async def test_access_log_in_the_combined_log_format(bus: TileBus, tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    web = start_web(bus, "--access-log", str(log))
    agent = 'hostile "agent" \\ with\ta tab and é'
    await get(web.url + "/?a=1", **{"User-Agent": agent, "Referer": "http://example.org/x"})
    await get(web.url + "/tiles/40/0/0.png")

    async def written() -> list[dict[str, str]] | None:
        lines = combined_lines(log.read_text()) if log.exists() else []
        return lines if any(line["request"].startswith("GET /tiles/40/") for line in lines) else None

    lines = await eventually(written)
    assert len(lines) == len(log.read_text().splitlines())  # every line is a combined one
    page = next(line for line in lines if line["request"] == "GET /?a=1 HTTP/1.1")
    assert page["host"] == "127.0.0.1" and page["status"] == "200" and int(page["bytes"]) > 0
    assert page["referer"] == "http://example.org/x"
    assert page["agent"] == "hostile \\x22agent\\x22 \\x5C with\\x09a tab and \\xC3\\xA9"  # as nginx escapes
    bad = next(line for line in lines if line["request"].startswith("GET /tiles/40/"))
    assert bad["status"] == "400" and bad["referer"] == "-"
    assert datetime.strptime(page["time"], "%d/%b/%Y:%H:%M:%S %z").tzinfo is not None


async def test_access_log_from_the_environment_to_stdout_and_off_by_default(
    bus: TileBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the two write their standard output to one log file (tests/services/tiles/conftest.py Proc)
    quiet = start_web(bus)
    await get(quiet.url + "/favicon.ico")
    assert combined_lines(quiet.proc.log.read_text()) == []
    monkeypatch.setenv("TOPOSM_ACCESS_LOG", "-")
    logged = start_web(bus)
    await get(logged.url + "/favicon.ico", **{"User-Agent": "from the environment"})

    async def written() -> list[dict[str, str]] | None:
        lines = combined_lines(logged.proc.log.read_text())
        return lines if any(line["agent"] == "from the environment" for line in lines) else None

    [favicon] = [line for line in await eventually(written) if line["request"] == "GET /favicon.ico HTTP/1.1"]
    assert int(favicon["bytes"]) == FAVICON.stat().st_size


def test_an_access_log_that_cannot_be_written_is_refused(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--access-log", str(tmp_path / "no" / "such" / "dir" / "access.log")])
    assert "--access-log" in capsys.readouterr().err
