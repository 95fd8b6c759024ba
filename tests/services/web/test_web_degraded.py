"""The pages when things are down, in a real Chromium: the real queuemaster stopped and started again, what a
person reads (what is down, since when, greyed figures, the badge, the map's banner and placeholders, the
reason a click is refused), and what the browser's console shows meanwhile."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import pytest
from PIL import Image

from harness import eventually
from qbroker import NoServer
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import Web, console_errors, csp_violations, wait_for
from tests.services.web.test_web_browser import ZOOM2_BACKGROUND

ZONE = "Asia/Kolkata"  # the viewer's clock: UTC+05:30, unlike the machine's
PLACEHOLDER_GREY = (236, 237, 240)  # services/web/static/tile-unavailable.png's background
CLOCK = r"\d\d:\d\d:\d\d"
# Why a stopped queuemaster does not answer: its queue went with it, or it is still there and requests
# expire in it (the broker decides which); either way in plain words, never an exception class.
QM_DOWN = (
    r"the queuemaster (is not running \(nobody serves toposm\.queuemaster on the bus\)|is not taking "
    r"requests: they wait in its queue until they expire \(stopped, or stuck\)|did not answer in time "
    r"\(stopped, overloaded or stuck\))"
)


async def status(web: Web) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(web.url + "/api/status") as response:
        result: dict[str, Any] = await response.json()
        return result


def local(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, ZoneInfo(ZONE)).strftime("%H:%M:%S")


async def text_of(browser: Any, element_id: str, when: str = "true") -> str:
    """The text of a visible element once ``when`` (a JS expression over ``e``, the element) holds."""
    result: str = await wait_for(
        browser,
        f"(() => {{ const e = document.getElementById('{element_id}');"
        f" return !e.hidden && ({when}) && e.textContent; }})()",
    )
    return result


async def is_stale(browser: Any, element_id: str) -> bool:
    return bool(
        await asyncio.to_thread(
            browser.execute_script, f"return document.getElementById('{element_id}').closest('.stale') !== null"
        )
    )


async def test_status_page_says_what_is_down_since_when_and_recovers(
    bus: TileBus, web: Web, browser: Any, artifacts: Path
) -> None:
    browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ZONE})
    await asyncio.to_thread(browser.get, web.url + "/")
    # No queuemaster yet: nothing to show, and the page says so rather than showing zeros or nothing.
    line = await text_of(browser, "qm-state", "e.classList.contains('error')")
    assert re.fullmatch(
        rf"queuemaster has not answered since toposm-web started at {CLOCK} \(\d+ s\): {QM_DOWN}", line
    ), line
    assert await text_of(browser, "queue-total") == "–"
    assert await text_of(browser, "counters") == "no answer from the queuemaster yet"
    assert await text_of(browser, "live") == "degraded: queuemaster down"

    qm = bus.queuemaster()
    bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    line = await text_of(browser, "qm-state", "e.classList.contains('recovered')")
    assert re.fullmatch(rf"queuemaster answering since {CLOCK}, after \d+ s without an answer", line), line
    await wait_for(browser, "document.getElementById('live').textContent === 'live'")
    await wait_for(browser, "document.querySelector('#counters tr[data-counter=requested]') !== null")
    assert not await is_stale(browser, "queue-total")

    # Dead letters of a clean bus: an alert nobody listens to, a call to a name nobody serves. Explained, and
    # neither looks like an error.
    await client.alert("test.nobody.listens", {"hello": 1})
    with pytest.raises(NoServer):
        await client.call("test.nobody.serves", {"command": "x"}, timeout=5)
    rows = await wait_for(
        browser,
        "(() => { const rows = Object.fromEntries([...document.querySelectorAll("
        "'#dead-letters tr')].map(tr => [tr.firstChild.textContent, "
        "[tr.className, tr.lastChild.textContent]]));"
        " return rows['alert.unroutable'] && rows['rpc.unroutable'] && rows; })()",
    )
    assert rows["alert.unroutable"][0] == "dead-normal" and rows["alert.unroutable"][1].startswith(
        "alerts nobody listens to (e.g. qbroker.start where no one follows starts): normal"
    ), rows
    assert rows["rpc.unroutable"][0] == "dead-notice" and rows["rpc.unroutable"][1].startswith(
        "requests to a name nobody serves, answered no_server at once"
    ), rows
    assert await console_errors(browser) == []  # a healthy page: not even a favicon missing

    qm.stop()
    line = await text_of(browser, "qm-state", "e.classList.contains('error')")
    heard_at = (await status(web))["queuemaster"]["heard_at"]
    assert re.fullmatch(rf"queuemaster not answering since {local(heard_at)} \(\d+ s\): {QM_DOWN}", line), line
    detail = await asyncio.to_thread(browser.execute_script, "return document.getElementById('qm-state').title")
    assert re.match(r"(fail|error)/", detail), detail  # the technical error is there, in the tooltip
    # The figures it gave last stay, greyed, and say when they are from; the badge does not say "live".
    assert await is_stale(browser, "queue-total") and await is_stale(browser, "counters")
    assert await is_stale(browser, "renderers")
    note = await text_of(browser, "threads-note")
    assert re.fullmatch(
        rf"As last heard at {local(heard_at)} \((just now|\d+ s ago)\): the queuemaster is not "
        r"answering\.",
        note,
    ), note
    assert await text_of(browser, "live") == "degraded: queuemaster down"
    await asyncio.to_thread(browser.save_screenshot, str(artifacts / "status-queuemaster-down.png"))

    bus.queuemaster()  # back: the page recovers by itself, and says so
    line = await text_of(browser, "qm-state", "e.classList.contains('recovered')")
    back_at = (await status(web))["queuemaster"]["back_at"]
    assert re.fullmatch(rf"queuemaster answering again since {local(back_at)}, after \d+ s without an answer", line), (
        line
    )
    await wait_for(browser, "document.getElementById('live').textContent === 'live'")
    assert not await is_stale(browser, "queue-total") and not await is_stale(browser, "renderers")
    assert await asyncio.to_thread(browser.execute_script, "return document.getElementById('threads-note').hidden")
    # The live stream never broke: nothing in the console all along.
    assert await console_errors(browser) == [] and await csp_violations(browser) == []


async def test_map_says_renders_are_unavailable_and_recovers(
    bus: TileBus, web: Web, browser: Any, artifacts: Path
) -> None:
    qm = bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    qm.stop()  # before any tile is rendered: every tile of the view is missing

    async def down() -> bool:
        return (await status(web))["queuemaster"]["down_since"] is not None

    await eventually(down)
    browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ZONE})
    await asyncio.to_thread(browser.get, web.url + "/map?zoom=2&lat=0&lon=0")
    banner = await text_of(browser, "banner", "e.classList.contains('unavailable')")
    heard_at = (await status(web))["queuemaster"]["heard_at"]
    assert re.fullmatch(
        rf"Renders unavailable since {local(heard_at)} \(\d+ s\): {QM_DOWN}\. Tiles already "
        r"rendered are shown; the others stay grey until renders are back, then load by "
        r"themselves\.",
        banner,
    ), banner
    # The missing tiles show as placeholders, not as errors.
    await wait_for(
        browser,
        "(() => { const t = [...document.querySelectorAll('img.leaflet-tile')];"
        " return t.length >= 4 && t.every(i => i.classList.contains('leaflet-tile-loaded')"
        " && getComputedStyle(i).opacity === '1'); })()",
    )
    counts = await screen_colours(browser, artifacts / "map-renders-unavailable.png")
    assert counts["placeholder"] > 0.3, counts
    assert await console_errors(browser) == []

    # A click says why it is refused.
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    click = ActionChains(browser).move_to_element_with_offset(browser.find_element(By.ID, "map"), 40, 40).click()
    await asyncio.to_thread(click.perform)
    popup = await wait_for(
        browser,
        "document.querySelector('.leaflet-popup-content') && "
        "document.querySelector('.leaflet-popup-content').textContent",
    )
    assert re.fullmatch(rf"render of 2/2/2 refused: renders unavailable: {QM_DOWN} \(try again in 10 s\)", popup), popup
    # The one console error a refusal cannot avoid: the refused request itself, which the popup explains.
    errors = await console_errors(browser)
    assert len(errors) == 1 and "/api/render" in errors[0] and "503" in errors[0], errors

    bus.queuemaster()  # back: the banner says so and the placeholders turn into tiles by themselves
    back = await text_of(browser, "banner", "e.classList.contains('back')")
    assert re.fullmatch(
        rf"Renders are back: the queuemaster answers again since {CLOCK}; the missing tiles "
        r"are loading\.",
        back,
    ), back
    await wait_for(browser, "document.getElementById('banner').hidden", timeout=60)

    async def rendered() -> dict[str, float] | None:
        loaded = await asyncio.to_thread(
            browser.execute_script,
            "const t = [...document.querySelectorAll('img.leaflet-tile')];"
            " return t.length >= 4 && !document.querySelector('.leaflet-zoom-anim') && t.every("
            "i => i.classList.contains('leaflet-tile-loaded') && getComputedStyle(i).opacity === '1'"
            " && getComputedStyle(i.parentElement).opacity === '1');",
        )
        counts = await screen_colours(browser, artifacts / "map-renders-back.png") if loaded else None
        return counts if counts and counts["zoom 2"] > 0.3 and counts["placeholder"] < 0.01 else None

    await eventually(rendered, timeout=90)
    assert await console_errors(browser) == [] and await csp_violations(browser) == []


async def screen_colours(browser: Any, path: Path) -> dict[str, float]:
    """The shares of the map area (below the header) in the placeholder's grey and the test pattern's."""
    png = await asyncio.to_thread(browser.get_screenshot_as_png)
    path.write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    area = image.crop((0, image.size[1] // 6, image.size[0], image.size[1]))
    counts = {colour: n for n, colour in area.getcolors(maxcolors=1 << 20) or []}
    total = area.size[0] * area.size[1]
    return {"placeholder": counts.get(PLACEHOLDER_GREY, 0) / total, "zoom 2": counts.get(ZOOM2_BACKGROUND, 0) / total}


async def test_live_badge_says_when_updates_stop(bus: TileBus, web: Web, browser: Any) -> None:
    bus.queuemaster()
    await wait_renderers(await bus.client(), 0)
    await asyncio.to_thread(browser.get, web.url + "/")
    await wait_for(browser, "document.getElementById('live').textContent === 'live'")
    os.kill(web.proc.pid, signal.SIGSTOP)  # toposm-web hangs: the stream stays open and says nothing
    try:
        badge = await text_of(browser, "live", "e.classList.contains('off')")
    finally:
        os.kill(web.proc.pid, signal.SIGCONT)
    assert re.fullmatch(rf"no update since {CLOCK}", badge), badge
    await wait_for(browser, "document.getElementById('live').textContent === 'live'")
