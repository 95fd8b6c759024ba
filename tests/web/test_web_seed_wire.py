"""toposm-web takes expirations from the seed's `osm` wire too (issue 21.2): a seed program publishes there
only, and with no queuemaster running nothing relays them to qbroker's `alert` exchange."""

from __future__ import annotations

import aio_pika
import aiohttp

from harness import eventually
from tests.tiles.conftest import TileBus
from tests.web.conftest import Web


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
