"""The seed's literal wire on the ``osm`` exchange, and the Mapnik backend through the bus."""

import json

import aio_pika
import mercantile
import pytest
from PIL import Image

from harness import eventually
from qbroker import RequestFailed
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Tile

from .conftest import stats, wait_renderers
from .seed_programs import ask, osm_client, osm_wire_ready


async def test_seed_wire_on_osm_exchange(bus):
    bus.queuemaster()
    bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    connection, exchange, replies = await osm_client(bus.url)
    try:
        await osm_wire_ready(connection)
        s = await ask(exchange, replies, b'{"command": "stats"}')
        assert s["command"] == "stats" and len(s["renderers"]) == 1
        rendered = await ask(exchange, replies, b'{"command": "render", "tile": "9/10/20"}')
        assert rendered == {"command": "rendered", "tile": "9/10/20", "metatile": "9/1/2"}
        bad = await ask(exchange, replies, b'{"command": "render", "tile": "9/10"}')
        assert bad["status"] == "fail" and bad["error"] == "invalid_params" and "9/10" in bad["detail"]
        broken = await ask(exchange, replies, b"{not json")
        assert broken["status"] == "fail" and broken["error"] == "bad_message"
        unknown = await ask(exchange, replies, b'{"command": "dance"}')
        assert unknown["status"] == "fail" and unknown["error"] == "unknown_command"
        # one command table behind both wires: the qbroker endpoint answers the same bad requests alike
        for body, raw in (({"command": "render", "tile": "9/10"}, bad), ({"command": "dance"}, unknown)):
            with pytest.raises(RequestFailed) as info:
                await client.call("toposm.queuemaster", body)
            assert (info.value.id, info.value.message, info.value.detail) == (
                raw["error"],
                raw["message"],
                raw.get("detail"),
            )
        # expirations as plain text on routing key expire_toposm
        await exchange.publish(aio_pika.Message(b"9/10/20;9/11/21;9/200/200"), routing_key="expire_toposm")

        async def taken():
            s = await stats(client)
            return s["counters"]["expired"] == 3

        await eventually(taken)

        async def rerendered():
            return len(bus.render_log_lines()) == 2  # 9/1/2 existed: rendered again; 9/25/25 never was

        await eventually(rerendered)
    finally:
        await connection.close()


async def test_queuemaster_online_reaches_seed_wire_listeners(bus):
    connection, exchange, _ = await osm_client(bus.url)
    try:
        channel = exchange.channel
        listen = await channel.declare_queue("", exclusive=True)
        await listen.bind(exchange, routing_key="toposm")
        bus.queuemaster()
        async with listen.iterator(timeout=20) as it:
            async for message in it:
                async with message.process():
                    assert json.loads(message.body) == {"command": "queuemaster online"}
                    break
    finally:
        await connection.close()


async def test_mapnik_renderer_draws_map_tiles(bus):
    bus.queuemaster()
    bus.renderer(backend="mapnik")
    client = await bus.client()
    await wait_renderers(client, 1)
    t = mercantile.tile(-19.95, 45.04, 15)  # Port Qbroker
    body = {"command": "render", "tile": f"15/{t.x}/{t.y}"}
    reply = await client.call("toposm.queuemaster", body, timeout=30)
    assert reply["command"] == "rendered"
    image = Image.open(TileStore(bus.tile_root).path(Tile(15, t.x, t.y))).convert("RGB")
    assert len(image.getcolors(256 * 256)) > 20  # a drawn map, not a flat test fill


async def test_osm_exchange_declared_differently_by_a_client_first(bus):
    """A seed program declared `osm` with its library's defaults (not durable) on a bus without accounts: the
    queuemaster uses it as it is and names the difference and what it costs (docs/tiles.md)."""
    connection = await aio_pika.connect(bus.url)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=False)
        replies = await channel.declare_queue("", exclusive=True)
        qm = bus.queuemaster()
        await osm_wire_ready(connection)
        s = await ask(exchange, replies, b'{"command": "stats"}')
        assert s["command"] == "stats"
        log = qm.log.read_text()
        assert "difference=\"exchange 'osm': durable is false there, qbroker declares true\"" in log, log[-3000:]
        assert "it is gone after a broker restart with its bindings" in log
    finally:
        await connection.close()


async def test_the_documented_osm_declaration_meets_the_services(bus):
    """docs/tiles.md: a seed program declares `osm` as a durable topic exchange (or passively, which is all a
    provisioned account may): both work beside the queuemaster, whichever comes first; the services' own
    declaration is the same, so they warn about nothing."""
    qm = bus.queuemaster()
    connection = await aio_pika.connect(bus.url)
    try:
        await osm_wire_ready(connection)
        channel = await connection.channel()
        exchange = await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=True)
        await channel.declare_exchange("osm", passive=True)
        replies = await channel.declare_queue("", exclusive=True)
        assert (await ask(exchange, replies, b'{"command": "stats"}'))["command"] == "stats"
        assert "shared object exists with other settings" not in qm.log.read_text()
    finally:
        await connection.close()


async def test_osm_wire_caps_message_size(bus, monkeypatch):
    """The osm wire refuses a body over the unit's max_body_bytes (here 64 KiB) with `too_large`."""
    monkeypatch.setenv("QBROKER_MAX_BODY_BYTES", str(64 * 1024))
    bus.queuemaster()
    connection, exchange, replies = await osm_client(bus.url)
    try:
        await osm_wire_ready(connection)
        big = json.dumps({"command": "stats", "pad": "x" * (128 * 1024)}).encode()
        refused = await ask(exchange, replies, big)
        assert refused["status"] == "fail" and refused["error"] == "too_large"
        assert (await ask(exchange, replies, b'{"command": "stats"}'))["command"] == "stats"
    finally:
        await connection.close()
