"""``toposm-web --front nginx``: Debian's nginx on the port serves hits itself, toposm-web the rest."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from harness import eventually
from services.web.same_origin import NOSNIFF, SECURITY_HEADERS
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import Web, start_web


@pytest.fixture(autouse=True)
def _nginx() -> None:
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.fail("nginx is missing: run bin/ensure-nginx (bin/test does)")


async def fetch(url: str) -> tuple[int, bytes, CIMultiDict[str]]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.read(), CIMultiDict(response.headers)


async def served_by_backend(web: Web, outcome: str) -> float:
    """How many tile requests toposm-web itself answered with this outcome (its /metrics)."""
    text = (await fetch(web.url + "/metrics"))[1].decode()
    found = re.search(rf'toposm_web_tile_requests_total\{{outcome="{outcome}"\}} ([0-9.e+]+)', text)
    return float(found.group(1)) if found else 0.0


def refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


async def test_hits_from_nginx_misses_and_dirty_tiles_from_toposm_web(bus: TileBus) -> None:
    web = start_web(
        bus,
        "--front",
        "nginx",
        "--cache-jitter",
        "0",
        "--cache-minimum",
        "1234",
        "--cache-low-zoom",
        "2:100",
        "--cache-medium-zoom",
        "4:200",
    )
    bus.queuemaster()
    renderer = bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    tile = web.url + "/tiles/12/1001/2047.png"
    status, body, headers = await fetch(tile)
    assert status == 200 and headers["X-Tile-State"] == "missing"  # rendered on demand by toposm-web
    assert body == (bus.tile_root / "12/1001/2047.png").read_bytes()
    for _ in range(3):
        status, body, headers = await fetch(tile)
        assert status == 200 and headers["X-Tile-State"] == "fresh" and headers["Server"] == "nginx"
        assert headers["Cache-Control"] == "max-age=1234" and "ETag" in headers  # the z12 band's floor
        assert headers["X-Content-Type-Options"] == NOSNIFF  # as toposm-web's own answers say
    assert await served_by_backend(web, "fresh") == 0  # every hit was nginx's alone
    async with (
        aiohttp.ClientSession() as session,
        session.get(tile, headers={"If-None-Match": headers["ETag"]}) as response,
    ):
        assert response.status == 304

    renderer.stop()  # keep the tile dirty
    await wait_renderers(client, 0)
    await client.alert("expire_toposm", "12/1002/2046", content_type="text/plain")  # the same metatile

    async def dirty() -> CIMultiDict[str] | None:
        headers = (await fetch(tile))[2]
        return headers if headers["X-Tile-State"] == "dirty" else None

    headers = await eventually(dirty)
    assert re.fullmatch(r"public, max-age=\d+", headers["Cache-Control"])
    assert 900 <= int(headers["Cache-Control"].rsplit("=", 1)[1]) <= 1350
    assert await served_by_backend(web, "dirty") >= 1
    assert (await fetch(web.url + "/tiles/12/4096/0.png"))[0] == 400  # bad coordinates: toposm-web's answer
    status, body, _ = await fetch(web.url + "/api/status")
    assert status == 200 and b"queuemaster" in body
    # The pages' headers come through nginx.
    status, _, headers = await fetch(web.url + "/map")
    assert status == 200 and headers["Server"] == "nginx"
    assert all(headers.get(name) == expected for name, expected in SECURITY_HEADERS.items()), headers
    # nginx passes on the Host the browser sent: the map's own request is served, another origin's refused.
    async with aiohttp.ClientSession() as session:
        for origin, expected in [(web.url, 202), ("http://evil.example", 403)]:
            async with session.post(
                web.url + "/api/render", json={"tile": "12/2000/2000"}, headers={"Origin": origin}
            ) as response:
                assert response.status == expected, (origin, await response.text())

    web.proc.stop()  # SIGTERM: toposm-web stops its nginx
    assert refused(web.url)


async def test_nginx_goes_when_toposm_web_is_killed(bus: TileBus) -> None:
    web = start_web(bus, "--front", "nginx")
    os.kill(web.proc.pid, signal.SIGKILL)  # toposm-web alone, not its process group: no stop() runs

    async def port_closed() -> bool:
        return refused(web.url)

    await eventually(port_closed)


async def test_front_logs_every_request_in_the_combined_format_and_serves_the_favicon(
    bus: TileBus, tmp_path: Path
) -> None:
    from tests.services.web.test_web_degraded_http import combined_lines

    log = tmp_path / "access.log"
    web = start_web(bus, "--front", "nginx", "--access-log", str(log))
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    tile = "/tiles/9/100/200.png"
    assert (await fetch(web.url + tile))[2]["X-Tile-State"] == "missing"  # toposm-web renders it
    status, _, headers = await fetch(web.url + tile)
    assert status == 200 and headers["X-Tile-State"] == "fresh" and headers["Server"] == "nginx"  # nginx's hit
    status, body, headers = await fetch(web.url + "/favicon.ico")
    assert status == 200 and headers["Content-Type"] == "image/x-icon" and body.startswith(b"\x00\x00\x01\x00")

    async def written() -> list[dict[str, str]] | None:
        lines = combined_lines(log.read_text()) if log.exists() else []
        return lines if any(line["request"] == "GET /favicon.ico HTTP/1.1" for line in lines) else None

    lines = await eventually(written)
    assert len(lines) == len(log.read_text().splitlines())  # nginx's combined is the same format
    # Each request once: the miss toposm-web answered and the hit nginx answered, both by the front alone.
    assert [line["status"] for line in lines if line["request"] == f"GET {tile} HTTP/1.1"] == ["200", "200"]
    assert all(line["host"] == "127.0.0.1" for line in lines)
