"""A gather ends as soon as the connection drops, with the replies it had, instead of waiting out its timeout."""

from __future__ import annotations

import asyncio
from urllib.parse import unquote, urlsplit

import pytest

from harness import HANG
from harness.broker import close_connections
from qbroker.testing import broker_of
from tests.conftest import MakeUnit


async def test_gather_ends_when_the_connection_drops(make_unit: MakeUnit, transport: str) -> None:
    listener, gatherer = await make_unit("test.listener"), await make_unit("test.gatherer")

    @listener.on_alert("test.census")
    async def census() -> str:
        return "here"

    await listener.start()
    await gatherer.start()
    replies = gatherer.gather("test.census", timeout=10 * HANG)  # far beyond the ceiling below
    first = await asyncio.wait_for(anext(replies), HANG)
    assert first.body == "here"

    if transport == "memory":
        assert broker_of(gatherer.config).drop_connections() >= 1
    else:
        vhost = unquote(urlsplit(gatherer.config.urls[0]).path.lstrip("/"))
        assert close_connections(vhost) >= 1
    with pytest.raises(StopAsyncIteration):  # ends now: the hang ceiling is a tenth of its own timeout
        await asyncio.wait_for(anext(replies), HANG)
