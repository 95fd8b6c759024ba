"""Another site's page in a viewer's browser against ``toposm-web`` (the real process and queuemaster): the
requests such a page can make the browser send are refused before they spend the viewer's render budget,
and every answer carries the headers that keep the pages to their own origin."""

from __future__ import annotations

import aiohttp
import pytest

from harness import eventually
from harness.private_node import free_port
from services.web.same_origin import SECURITY_HEADERS, is_own_origin
from tests.prometheus_text import value
from tests.services.tiles.conftest import TileBus, stats, wait_renderers
from tests.services.web.conftest import Web, start_web

BODY = b'{"tile": "12/0/0"}'
EVIL = "http://evil.example"
# What a page of another site can make a browser send without asking toposm-web first (a "simple" request:
# a form's encodings or text/plain), and JSON that the browser says comes from elsewhere.
CROSS_SITE = [
    ({"Content-Type": "text/plain", "Origin": EVIL, "Sec-Fetch-Site": "cross-site"}, 415),
    ({"Content-Type": "text/plain;charset=UTF-8"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL}, 415),
    ({"Content-Type": "multipart/form-data; boundary=x", "Origin": EVIL}, 415),
    ({}, 415),  # no Content-Type at all
    ({"Content-Type": "application/json", "Origin": EVIL}, 403),
    ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
    ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403),
    ({"Content-Type": "application/json", "Origin": "null"}, 403),  # a sandboxed frame, a file: page
]


async def post(session: aiohttp.ClientSession, web: Web, headers: dict[str, str], body: bytes = BODY) -> int:
    # skip_auto_headers: no Content-Type of aiohttp's choosing where the case has none
    async with session.post(
        web.url + "/api/render", data=body, headers=headers, skip_auto_headers={"Content-Type"}
    ) as response:
        await response.read()
        return response.status


async def counters(tb: TileBus) -> dict[str, int]:
    result: dict[str, int] = (await stats(await tb.client()))["counters"]
    return result


async def on_demand(session: aiohttp.ClientSession, web: Web) -> float:
    async with session.get(web.url + "/metrics") as response:
        return value(await response.text(), "toposm_web_on_demand_renders")


async def test_cross_site_requests_are_refused_before_they_spend_anything(bus: TileBus) -> None:
    bus.queuemaster()
    await wait_renderers(await bus.client(), 0)  # no renderer: an admitted render stays in flight
    web = start_web(bus, "--render-timeout", "60")
    before = await counters(bus)
    other_port = f"http://127.0.0.1:{free_port()}"  # the same host, another origin
    async with aiohttp.ClientSession() as session:
        answers = [await post(session, web, headers) for headers, _ in CROSS_SITE]
        answers.append(await post(session, web, {"Content-Type": "application/json", "Origin": other_port}))
        assert answers == [status for _, status in CROSS_SITE] + [403]
        assert await on_demand(session, web) == 0
        assert await counters(bus) == before  # nothing reached the queuemaster

        # The map's own fetch (what Chromium sends: tests/services/web/test_web_browser.py clicks it) and a program
        # that says nothing of where it runs are served.
        own = {"Content-Type": "application/json", "Origin": web.url, "Sec-Fetch-Site": "same-origin"}
        assert await post(session, web, own) == 202
        assert (
            await post(session, web, {"Content-Type": "application/json; charset=utf-8"}, b'{"tile": "12/8/0"}') == 202
        )
        assert await on_demand(session, web) == 2

    async def expired() -> int | None:
        grown = (await counters(bus))["expired"] - before["expired"]
        return grown if grown else None

    assert await eventually(expired) == 2


async def test_every_answer_carries_the_page_headers(web: Web) -> None:
    async with aiohttp.ClientSession() as session:
        for path, status in [
            ("/", 200),
            ("/map", 200),
            ("/static/map.js", 200),
            ("/api/status", 200),
            ("/metrics", 200),
            ("/nope", 404),
            ("/tiles/abc/0/0.png", 400),
        ]:
            async with session.get(web.url + path) as response:
                assert response.status == status, path
                for name, expected in SECURITY_HEADERS.items():
                    assert response.headers.get(name) == expected, (path, name)
        async with session.post(web.url + "/api/render", data=BODY, headers={"Content-Type": "text/plain"}) as response:
            assert response.status == 415 and response.headers["X-Frame-Options"] == "DENY"
            assert (await response.text()).startswith("415: the body must be JSON")
    csp = SECURITY_HEADERS["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp and "script-src 'self'" in csp


@pytest.mark.parametrize(
    ("origin", "host", "own"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
        ("https://tiles.example", "tiles.example", True),
        ("https://Tiles.Example:443", "tiles.example", True),
        ("http://tiles.example", "tiles.example:80", True),
        ("http://[::1]:8080", "[::1]:8080", True),
        ("https://tiles.example", "tiles.example:8443", False),
        ("http://127.0.0.1:8081", "127.0.0.1:8080", False),
        ("http://evil.example", "tiles.example", False),
        ("http://tiles.example.evil.example", "tiles.example", False),
        ("null", "tiles.example", False),
        ("file://", "tiles.example", False),
        ("http://tiles.example/path", "tiles.example", False),
        ("http://tiles.example", None, False),
        ("http://[bad", "tiles.example", False),
    ],
)
def test_own_origin(origin: str, host: str | None, own: bool) -> None:
    assert is_own_origin(origin, host) is own
