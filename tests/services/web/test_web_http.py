"""toposm-web over HTTP: tiles on demand, dirty tiles, bad input, the render budgets, metrics, JSON."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from harness import eventually
from tests.services.tiles.conftest import TileBus, wait_renderers
from tests.services.web.conftest import Web, start_web

PNG = b"\x89PNG\r\n\x1a\n"


async def get(url: str) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.read(), dict(response.headers)


async def overlay(web: Web) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(web.url + "/api/overlay") as response:
        result: dict[str, Any] = await response.json()
        return result


async def test_missing_tile_is_rendered_on_demand_then_served_fresh(bus: TileBus, web: Web) -> None:
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    status, body, headers = await get(web.url + "/tiles/5/3/4.png")
    assert status == 200, body
    assert body.startswith(PNG) and headers["X-Tile-State"] == "missing"  # missing, rendered for this request
    assert (bus.tile_root / "5/3/4.png").read_bytes() == body
    status, body, headers = await get(web.url + "/tiles/5/3/4.png")
    assert status == 200 and headers["X-Tile-State"] == "fresh"


async def test_dirty_tile_is_served_at_once_and_rendered_again(bus: TileBus, web: Web) -> None:
    bus.queuemaster()
    renderer = bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    assert (await get(web.url + "/tiles/6/10/20.png"))[0] == 200
    before = (bus.tile_root / "6/10/20.png").stat().st_mtime_ns
    renderer.stop()  # nobody renders now: the tile stays dirty until a renderer comes back
    await wait_renderers(client, 0)
    await client.alert("expire_toposm", "6/10/20", content_type="text/plain")

    async def tracked() -> bool:
        return any(m["state"] == "expired" for m in (await overlay(web))["metatiles"])

    await eventually(tracked)
    status, body, headers = await get(web.url + "/tiles/6/10/20.png")
    assert status == 200 and body.startswith(PNG)
    assert headers["X-Tile-State"] == "dirty"
    bus.renderer()

    async def rerendered() -> bool:
        return (bus.tile_root / "6/10/20.png").stat().st_mtime_ns > before

    await eventually(rerendered)
    assert (await get(web.url + "/tiles/6/10/20.png"))[2]["X-Tile-State"] == "fresh"


@pytest.mark.parametrize(
    "path",
    [
        "/tiles/abc/1/2.png",
        "/tiles/3/8/0.png",
        "/tiles/3/0/8.png",
        "/tiles/19/0/0.png",
        "/tiles/-1/0/0.png",
        "/tiles/2/%2B1/0.png",
        "/tiles/99999999999999999999/0/0.png",
    ],
)
async def test_bad_coordinates_are_400(web: Web, path: str) -> None:
    status, body, _ = await get(web.url + path)
    assert status == 400, (path, body)
    assert b"Traceback" not in body and body.startswith(b"400: ")


@pytest.mark.parametrize(
    "path", ["/nope", "/tiles/1/0/0.jpg", "/tiles/1/0.png", "/static/../pyproject.toml", "/static/vendor/nothing.js"]
)
async def test_unknown_paths_are_404(web: Web, path: str) -> None:
    status, body, _ = await get(web.url + path)
    assert status == 404, (path, body)
    assert b"Traceback" not in body


@pytest.mark.parametrize("body", [b"not json", b'{"tile": 3}', b'["1/0/0"]', b'{"tile": "1/5/0"}'])
async def test_bad_render_requests_are_400(web: Web, body: bytes) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(web.url + "/api/render", data=body, headers={"Content-Type": "application/json"}) as response,
    ):
        assert response.status == 400
        assert b"Traceback" not in await response.read()


async def test_on_demand_renders_are_capped_per_client_and_in_total(bus: TileBus) -> None:
    """No renderer: every on-demand render stays in flight, so the budgets fill up and stay full."""
    bus.queuemaster()
    await wait_renderers(await bus.client(), 0)  # a render sent before the queuemaster is up is answered at once
    web = start_web(bus, "--max-renders-per-client", "2", "--max-renders", "3", "--render-timeout", "60")
    async with aiohttp.ClientSession() as session:

        async def fetch(path: str) -> int:
            async with session.get(web.url + path) as response:
                await response.read()
                return response.status

        waiting = [asyncio.create_task(fetch(f"/tiles/8/{8 * i}/0.png")) for i in range(2)]

        async def two_in_flight() -> bool:
            async with session.get(web.url + "/metrics") as response:
                return "toposm_web_on_demand_renders 2.0" in await response.text()

        await eventually(two_in_flight)
        status, body, headers = await get(web.url + "/tiles/8/64/0.png")
        assert status == 429 and "Retry-After" in headers, body
        # another client (the map click endpoint counts against the same budgets) may take the last slot
        async with session.post(web.url + "/api/render", json={"tile": "8/80/0"}) as response:
            assert response.status == 429  # same client address: still over its own limit
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


async def test_total_budget_answers_503(bus: TileBus) -> None:
    bus.queuemaster()
    await wait_renderers(await bus.client(), 0)  # so the first render stays in flight, holding the budget
    web = start_web(bus, "--max-renders-per-client", "5", "--max-renders", "1", "--render-timeout", "60")
    async with aiohttp.ClientSession() as session:
        async with session.post(web.url + "/api/render", json={"tile": "9/0/0"}) as response:
            assert response.status == 202, await response.text()
        status, body, headers = await get(web.url + "/tiles/9/64/64.png")
        assert status == 503 and b"budget" in body and headers.get("Retry-After")


async def test_render_timeout_answers_503_not_a_hang(bus: TileBus) -> None:
    bus.queuemaster()  # no renderer: the render never finishes
    await wait_renderers(await bus.client(), 0)  # the queuemaster answers: a render sent now waits
    web = start_web(bus, "--render-timeout", "1")
    status, body, headers = await get(web.url + "/tiles/4/0/0.png")
    assert status == 503 and b"not rendered within" in body and headers.get("Retry-After")


async def test_metrics_and_json_status(bus: TileBus, web: Web) -> None:
    bus.queuemaster()
    bus.renderer()
    await wait_renderers(await bus.client(), 1)
    assert (await get(web.url + "/tiles/3/1/1.png"))[0] == 200

    async def scraped() -> str | None:
        text = (await get(web.url + "/metrics"))[1].decode()
        return text if "toposm_web_queuemaster_up 1.0" in text else None

    text = await eventually(scraped)
    for name in (
        'toposm_web_rpc_calls_total{endpoint="toposm.queuemaster",status="ok"}',
        'toposm_web_tile_requests_total{outcome="',
        "qbroker_calls_total{",
        "qbroker_call_duration_seconds_bucket{",
        "toposm_web_build_info{",
    ):
        assert name in text, name
    status, body, headers = await get(web.url + "/api/status")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    async with aiohttp.ClientSession() as session, session.get(web.url + "/api/status") as response:
        snapshot = await response.json()
    assert snapshot["queuemaster"]["online"] is True
    assert snapshot["renderers"][0]["renderer"].startswith("toposm.render.")
    assert snapshot["queuemaster"]["counters"]["requested"] >= 1
