"""Tile freshness kept in the tile root (it survives a restart of toposm-web) and mod_tile's cache headers."""

from __future__ import annotations

import re

import aiohttp
from multidict import CIMultiDict

from harness import eventually
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import start_web

FRESH_FLOOR = 1000  # --cache-minimum for zooms above the medium band, with no jitter: exact max-ages


async def fetch(url: str, **headers: str) -> tuple[int, CIMultiDict[str]]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        await response.read()
        return response.status, CIMultiDict(response.headers)


def max_age(headers: CIMultiDict[str]) -> int:
    found = re.search(r"max-age=(\d+)", headers["Cache-Control"])
    assert found, headers
    return int(found.group(1))


async def test_expired_tile_stays_dirty_across_a_restart_with_mod_tile_cache_headers(bus: TileBus) -> None:
    options = (
        "--cache-minimum",
        str(FRESH_FLOOR),
        "--cache-low-zoom",
        "3:9000",
        "--cache-medium-zoom",
        "5:5000",
        "--cache-jitter",
        "0",
        "--cache-dirty",
        "60",
    )
    web = start_web(bus, *options)
    bus.queuemaster()
    renderer = bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    tile = web.url + "/tiles/7/20/30.png"
    status, headers = await fetch(tile)
    assert status == 200 and headers["X-Tile-State"] == "missing"
    status, headers = await fetch(tile)
    assert status == 200 and headers["X-Tile-State"] == "fresh"
    assert max_age(headers) == FRESH_FLOOR and "Expires" in headers  # z7: above the low (3) and medium (5) bands
    assert max_age((await fetch(web.url + "/tiles/5/2/3.png"))[1]) == 5000  # z5: the medium band
    status, _ = await fetch(tile, **{"If-None-Match": headers["ETag"]})
    assert status == 304

    renderer.stop()  # nothing re-renders the tile from here on: it must stay dirty
    await wait_renderers(client, 0)
    await client.alert("expire_toposm", "7/21/31", content_type="text/plain")  # same metatile as 7/20/30

    async def dirty() -> bool:
        return (await fetch(tile))[1]["X-Tile-State"] == "dirty"

    await eventually(dirty)
    web.proc.stop()
    web = start_web(bus, *options)
    tile = web.url + "/tiles/7/20/30.png"
    status, headers = await fetch(tile)
    assert status == 200 and headers["X-Tile-State"] == "dirty"
    assert 60 <= max_age(headers) <= 90  # DurationDirty plus up to half of it
    other = web.url + "/tiles/7/40/30.png"  # another metatile, never rendered
    status, headers = await fetch(other)
    assert headers["X-Tile-State"] == "missing" and headers["Cache-Control"] == "no-store"


async def test_rerendered_tile_is_fresh_again(bus: TileBus) -> None:
    web = start_web(bus, "--rerender-interval", "0")  # a re-render right after the render is not a no-op
    bus.queuemaster()
    bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    tile = web.url + "/tiles/6/1/1.png"
    assert (await fetch(tile))[0] == 200
    before = (bus.tile_root / "6/1/1.png").stat().st_mtime_ns
    async with (
        aiohttp.ClientSession() as session,
        session.post(web.url + "/api/render", json={"tile": "6/1/1"}) as response,
    ):
        assert response.status == 202

    async def fresh_again() -> bool:
        return (bus.tile_root / "6/1/1.png").stat().st_mtime_ns > before and (await fetch(tile))[1][
            "X-Tile-State"
        ] == "fresh"

    await eventually(fresh_again)
    assert not any(p.is_file() for p in (bus.tile_root / ".expired").rglob("*"))  # the marker is gone
