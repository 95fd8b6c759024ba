"""``--tile-store meta`` end to end: the queuemaster, a Mapnik renderer drawing the Helsinki extract and toposm-web
on one tile root of mod_tile ``.meta`` files. The tiles served are the bytes an independent reader finds in the
files (tests/services/tiles/test_meta_store.py), with ETag/304s, the map's extent, and freshness: an expired metatile is
served dirty (its file set back 20 years, as mod_tile marks it) until it is rendered again."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import mercantile
import pytest

from harness import eventually
from services.web.main import parse_args
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data  # noqa: F401 - session fixtures
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.tiles.test_meta_store import mod_tile_path, read_meta
from tests.services.web.conftest import start_web
from tests.services.web.test_tile_freshness import fetch

LON, LAT = 24.945, 60.17  # central Helsinki


async def test_toposm_web_serves_a_meta_store(bus: TileBus, imported_store: Path) -> None:  # noqa: F811
    web = start_web(bus, "--tile-store", "meta")
    bus.queuemaster("--tile-store", "meta")
    renderer = bus.renderer("--tile-store", "meta", "--store", str(imported_store), backend="mapnik")
    client = await bus.client()
    await wait_renderers(client, 1, timeout=60)
    t = mercantile.tile(LON, LAT, 15)
    url = f"{web.url}/tiles/15/{t.x}/{t.y}.png"
    meta = mod_tile_path(bus.tile_root, t.x, t.y, 15)

    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200 and response.headers["X-Tile-State"] == "missing"
        body = await response.read()
    magic, _, _, stored = read_meta(meta)
    assert magic == b"META" and body == stored[(t.x, t.y)] and body.startswith(b"\x89PNG")
    assert not list(bus.tile_root.rglob("*.png"))

    status, headers = await fetch(url)
    assert status == 200 and headers["X-Tile-State"] == "fresh" and headers["Content-Type"] == "image/png"
    assert (await fetch(url, **{"If-None-Match": headers["ETag"]}))[0] == 304
    assert (await fetch(url, **{"If-Modified-Since": headers["Last-Modified"]}))[0] == 304
    async with aiohttp.ClientSession() as session, session.get(web.url + "/api/extent") as response:
        extent = await response.json()
    (south, west), (north, east) = extent["bounds"]
    assert extent["zoom"] == 15 and south < LAT < north and west < LON < east

    renderer.stop()  # nothing re-renders it until a renderer is back: it stays dirty
    await wait_renderers(client, 0)
    await client.alert("expire_toposm", f"15/{t.x}/{t.y}", content_type="text/plain")

    async def dirty() -> bool:
        return (await fetch(url))[1]["X-Tile-State"] == "dirty"

    await eventually(dirty)
    marked = meta.stat().st_mtime
    assert time.gmtime(marked).tm_year <= time.gmtime().tm_year - 20  # mod_tile's own mark

    bus.renderer("--tile-store", "meta", "--store", str(imported_store), backend="mapnik")

    async def fresh_again() -> bool:
        return (await fetch(url))[1]["X-Tile-State"] == "fresh"

    await eventually(fresh_again, timeout=60)
    assert meta.stat().st_mtime > marked  # written again: no longer carries the expiry mark


def test_the_nginx_front_is_refused_for_a_meta_store() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tile-store", "meta", "--front", "nginx"])
    assert parse_args(["--tile-store", "meta"]).tile_store == "meta"
