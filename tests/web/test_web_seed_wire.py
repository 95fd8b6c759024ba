"""toposm-web on the seed's `osm` wire: it takes expirations from there too (a seed program
publishes there only, and with no queuemaster running nothing relays them to qbroker's `alert` exchange),
and listens on `toposm` there, as every program does (docs/tiles.md, "Who listens on `toposm`")."""

from __future__ import annotations

from typing import Any

import aio_pika
import aiohttp

from harness import eventually
from tests.tiles.conftest import TileBus, stats
from tests.tiles.seed_programs import osm_client
from tests.web.conftest import Web, start_web


async def test_expiry_published_only_on_osm_marks_the_metatile_expired(bus: TileBus, web: Web) -> None:
    connection = await aio_pika.connect(bus.url)
    try:
        channel = await connection.channel()
        osm = await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=True)

        async def tracked() -> bool:
            # published again until heard: the web's osm queue may be bound a moment after it answers HTTP
            await osm.publish(aio_pika.Message(b"6/10/20"), routing_key="expire_toposm")
            async with aiohttp.ClientSession() as session, session.get(web.url + "/api/overlay") as response:
                metatiles = (await response.json())["metatiles"]
            return any(m["state"] == "expired" for m in metatiles)

        await eventually(tracked)
    finally:
        await connection.close()


ONLINE = b'{"command": "queuemaster online"}'


async def test_toposm_web_polls_a_queuemaster_announced_on_osm(bus: TileBus) -> None:
    """toposm-web listens on `toposm` on `osm`: a `queuemaster online` there has it poll the queuemaster at
    once (its own poll interval here is an hour)."""
    bus.queuemaster()
    client = await bus.client()
    await eventually(lambda: stats(client))
    web = start_web(bus, "--poll-interval", "3600")
    connection, exchange, _ = await osm_client(bus.url)

    async def seen_by_web() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(web.url + "/api/status") as response:
            return (await response.json())["queuemaster"]  # type: ignore[no-any-return]

    async def first_poll() -> dict[str, Any] | None:  # at start
        seen = await seen_by_web()
        return seen if seen["online"] else None

    try:
        first = await eventually(first_poll)
        assert first["counters"].get("expired", 0) == 0, first
        await client.alert("expire_toposm", "12/8/8", content_type="text/plain")

        async def taken() -> bool:
            return (await stats(client))["counters"].get("expired") == 1

        await eventually(taken)

        async def polled() -> bool:
            # published again until heard: the web's osm queue may be bound a moment after it answers HTTP
            await exchange.publish(aio_pika.Message(ONLINE), routing_key="toposm")
            return (await seen_by_web())["counters"].get("expired") == 1

        await eventually(polled, interval=1.0)
    finally:
        await connection.close()
