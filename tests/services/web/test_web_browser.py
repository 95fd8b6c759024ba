"""The pages in a real headless Chromium: the live status page and the slippy map (pixels, not only DOM)."""

from __future__ import annotations

import asyncio
import io
import re
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
from PIL import Image

from harness import eventually
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import Web, console_errors, csp_violations, wait_for

ZOOM2_BACKGROUND = (230, 255, 230)  # the test-pattern backend's colour for zoom 2
OUTLINE = (200, 0, 0)


async def test_status_page_is_live(bus: TileBus, web: Web, browser: Any, artifacts: Path) -> None:
    bus.queuemaster()
    bus.renderer(threads=2)
    await wait_renderers(await bus.client(), 2)
    browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
    await asyncio.to_thread(browser.get, web.url + "/")
    await wait_for(
        browser,
        "document.querySelectorAll('#renderers tr td:first-child').length === 2 && "
        "[...document.querySelectorAll('#renderers td:first-child')]"
        ".every(td => td.textContent.startsWith('toposm.render.'))",
    )
    assert await wait_for(browser, "document.getElementById('live').textContent") == "live"
    before = await wait_for(
        browser,
        "document.querySelector('#counters tr[data-counter=requested]')"
        " && document.querySelector('#counters tr[data-counter=requested]')"
        ".lastChild.textContent",
    )
    async with aiohttp.ClientSession() as session:
        async with session.post(web.url + "/api/render", json={"tile": "7/3/3"}) as response:
            assert response.status == 202
    # Wait on the DOM: the page must change without a reload.
    after = await wait_for(
        browser,
        "(() => { const c = document.querySelector("
        "'#counters tr[data-counter=requested]').lastChild.textContent;"
        f" return c !== '{before}' && c; }})()",
    )
    assert int(after) > int(before)
    row = await wait_for(
        browser,
        "(() => { const tr = [...document.querySelectorAll('#recent tr')].find("
        "tr => tr.firstChild.textContent === '7/0/0');"
        " return tr && [...tr.children].map(td => td.textContent); })()",
    )
    # When it finished, on the viewer's clock (UTC+05:30 here), and how long ago.
    async with aiohttp.ClientSession() as session, session.get(web.url + "/api/status") as response:
        render = next(r for r in (await response.json())["recent_renders"] if r["metatile"] == "7/0/0")
    ended = datetime.fromtimestamp(render["start"] + render["duration"], ZoneInfo("Asia/Kolkata"))
    assert re.fullmatch(ended.strftime("%H:%M:%S") + r" (just now|\d+ s ago)", row[3]), row
    await asyncio.to_thread(browser.save_screenshot, str(artifacts / "status.png"))
    assert await csp_violations(browser) == []  # the page keeps to its own Content-Security-Policy
    assert await console_errors(browser) == []  # nothing in red for whoever opens the developer tools


async def test_map_shows_tiles_from_the_store(bus: TileBus, web: Web, browser: Any, artifacts: Path) -> None:
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    await asyncio.to_thread(browser.get, web.url + "/map?zoom=2&lat=0&lon=0")
    # The tiles are missing at first: each is rendered on demand, then shown.
    await wait_for(browser, "document.querySelectorAll('img.leaflet-tile-loaded').length >= 4", timeout=60)
    assert "© OpenStreetMap contributors" in await wait_for(
        browser, "document.querySelector('.leaflet-control-attribution').textContent"
    )
    assert await wait_for(browser, "typeof L === 'object' && L.version") == "1.9.4"  # the vendored copy
    # The on-demand renders are over: the overlay (refreshed every 5 s) drops their metatiles.
    await wait_for(browser, "document.getElementById('overlay-count').textContent === 'overlay: 0 metatiles'")
    # Leaflet fades each tile in over a few animation frames, which a loaded headless browser may draw late:
    # wait until every tile on the page is loaded and opaque, so the pixels below are the tiles' own.
    await wait_for(
        browser,
        "(() => { const t = [...document.querySelectorAll('img.leaflet-tile')];"
        " return t.length >= 4 && !document.querySelector('.leaflet-zoom-anim') && t.every("
        "i => i.classList.contains('leaflet-tile-loaded') && getComputedStyle(i).opacity === '1'"
        " && getComputedStyle(i.parentElement).opacity === '1'); })()",
    )
    png = await asyncio.to_thread(browser.get_screenshot_as_png)
    (artifacts / "map.png").write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    area = image.crop((0, height // 6, width, height))  # below the header
    colours = area.getcolors(maxcolors=1 << 20) or []
    counts = {colour: n for n, colour in colours}
    total = area.size[0] * area.size[1]
    assert counts.get(ZOOM2_BACKGROUND, 0) > total * 0.3, "the test-pattern tiles are not on screen"
    assert counts.get(OUTLINE, 0) > 100, "the tile outlines of the test pattern are not on screen"
    assert await csp_violations(browser) == []  # Leaflet and the map keep to the Content-Security-Policy
    assert await console_errors(browser) == []
    # which is in force: a script another site's text could inject into the page does not run.
    await asyncio.to_thread(
        browser.execute_script,
        "const s = document.createElement('script');"
        " s.textContent = 'window.injected = true'; document.body.appendChild(s);",
    )
    assert await wait_for(browser, "window.cspViolations.length && window.cspViolations") == ["script-src-elem inline"]
    assert await asyncio.to_thread(browser.execute_script, "return window.injected === undefined")


async def test_a_click_on_the_map_requests_a_render(bus: TileBus, web: Web, browser: Any) -> None:
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    await asyncio.to_thread(browser.get, web.url + "/map?zoom=3&lat=0&lon=0")
    await wait_for(browser, "document.querySelectorAll('img.leaflet-tile-loaded').length >= 4", timeout=60)
    before = (bus.tile_root / "3/4/4.png").stat().st_mtime_ns  # the tile under the map's centre
    # A real click (the WebDriver's mouse), just below and right of the centre: tile 3/4/4.
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    element = browser.find_element(By.ID, "map")
    click = ActionChains(browser).move_to_element_with_offset(element, 40, 40).click()
    await asyncio.to_thread(click.perform)
    popup = await wait_for(
        browser,
        "document.querySelector('.leaflet-popup-content') && "
        "document.querySelector('.leaflet-popup-content').textContent",
    )
    assert popup == "render of 3/4/4 requested", popup

    async def rerendered() -> bool:
        return (bus.tile_root / "3/4/4.png").stat().st_mtime_ns > before

    await eventually(rerendered)
    assert await csp_violations(browser) == [] and await console_errors(browser) == []
