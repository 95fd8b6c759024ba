"""Where the map opens, in a real headless Chromium: on the tile store's data unless the URL says otherwise, and
its view kept in the URL hash (#map=zoom/lat/lon, as on openstreetmap.org) across a reload."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from harness import eventually
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import Web, wait_for

HELSINKI = (60.1699, 24.9384)
HELSINKI_Z12 = "12/2331/1185"  # the tile holding central Helsinki


async def extent(web: Web) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(web.url + "/api/extent") as response:
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


async def test_the_map_opens_where_the_tiles_are(bus: TileBus, web: Web, browser: Any) -> None:
    assert await extent(web) == {"zoom": None, "bounds": None}  # an empty store: the page shows the world
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    async with aiohttp.ClientSession() as session:
        async with session.post(web.url + "/api/render", json={"tile": HELSINKI_Z12}) as response:
            assert response.status == 202
    await eventually(lambda: (bus.tile_root / f"{HELSINKI_Z12}.png").exists())
    (south, west), (north, east) = (await extent(web))["bounds"]
    assert south < HELSINKI[0] < north and west < HELSINKI[1] < east

    await asyncio.to_thread(browser.get, web.url + "/map")  # no view in the URL
    await wait_for(browser, "location.hash.startsWith('#map=')")
    assert await wait_for(browser, f"map.getBounds().contains(L.latLng({HELSINKI[0]}, {HELSINKI[1]}))")
    assert 9 <= await wait_for(browser, "map.getZoom()") <= 12  # the metatile fills the view, not the world
    zoom, lat, lon = (
        float(part) for part in (await wait_for(browser, "location.hash")).removeprefix("#map=").split("/")
    )
    assert (zoom, round(lat, 1), round(lon, 1)) == (await wait_for(browser, "map.getZoom()"), 60.1, 25.0)


async def test_the_view_lives_in_the_url_hash(web: Web, browser: Any) -> None:
    await asyncio.to_thread(browser.get, web.url + "/map#map=15/60.16990/24.93840")
    await wait_for(browser, "typeof map === 'object' && map.getZoom() === 15")
    assert await wait_for(browser, "[map.getCenter().lat.toFixed(4), map.getCenter().lng.toFixed(4)]") == [
        "60.1699",
        "24.9384",
    ]
    # Moving the map rewrites the hash (no new history entry), as openstreetmap.org does.
    await asyncio.to_thread(browser.execute_script, "map.setView([60.2, 24.9], 13)")
    assert await wait_for(browser, "location.hash === '#map=13/60.2000/24.9000' && location.hash")
    await asyncio.to_thread(browser.refresh)
    await wait_for(browser, "typeof map === 'object' && map.getZoom() === 13")
    assert await wait_for(browser, "[map.getCenter().lat.toFixed(4), map.getCenter().lng.toFixed(4)]") == [
        "60.2000",
        "24.9000",
    ]
    # A link someone shares, typed into the same page: the map goes there.
    await asyncio.to_thread(browser.execute_script, "location.hash = '#map=11/60.1/24.8'")
    await wait_for(browser, "map.getZoom() === 11 && map.getCenter().lng.toFixed(1) === '24.8'")
