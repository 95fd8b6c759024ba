"""The seed's literal wire on the ``osm`` exchange, and the Mapnik backend through the bus."""

import asyncio
import json
import uuid

import aio_pika
import mercantile
import pytest
from PIL import Image

from qbroker import RequestFailed
from services.tiles.tile_store import TileStore
from services.tiles.tilemath import Tile

from .conftest import eventually, stats, wait_renderers


async def _osm_client(url):
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    exchange = await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=True)
    replies = await channel.declare_queue("", exclusive=True)
    return connection, exchange, replies


async def _osm_wire_ready(connection):
    """The queuemaster consumes its osm queue (it declares it after its qbroker endpoint already answers)."""
    async def consumed():
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue("toposm.queuemaster.osm", passive=True)
            return queue.declaration_result.consumer_count > 0
        except aio_pika.exceptions.ChannelClosed:  # not declared yet
            return False
        finally:
            if not channel.is_closed:
                await channel.close()

    await eventually(consumed)


async def _ask(exchange, replies, body: bytes, timeout=20.0):
    correlation_id = uuid.uuid4().hex
    await exchange.publish(aio_pika.Message(body, content_type="application/json", reply_to=replies.name,
                                            correlation_id=correlation_id), routing_key="toposm.queuemaster")
    async with replies.iterator(timeout=timeout) as it:
        async for message in it:
            async with message.process():
                if message.correlation_id == correlation_id:
                    return json.loads(message.body)


async def test_seed_wire_on_osm_exchange(bus):
    bus.queuemaster()
    bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    connection, exchange, replies = await _osm_client(bus.url)
    try:
        await _osm_wire_ready(connection)
        s = await _ask(exchange, replies, b'{"command": "stats"}')
        assert s["command"] == "stats" and len(s["renderers"]) == 1
        rendered = await _ask(exchange, replies, b'{"command": "render", "tile": "9/10/20"}')
        assert rendered == {"command": "rendered", "tile": "9/10/20", "metatile": "9/1/2"}
        bad = await _ask(exchange, replies, b'{"command": "render", "tile": "9/10"}')
        assert bad["status"] == "fail" and bad["error"] == "invalid_params" and "9/10" in bad["detail"]
        broken = await _ask(exchange, replies, b"{not json")
        assert broken["status"] == "fail" and broken["error"] == "bad_message"
        unknown = await _ask(exchange, replies, b'{"command": "dance"}')
        assert unknown["status"] == "fail" and unknown["error"] == "unknown_command"
        # one command table behind both wires: the qbroker endpoint answers the same bad requests alike
        for body, raw in (({"command": "render", "tile": "9/10"}, bad), ({"command": "dance"}, unknown)):
            with pytest.raises(RequestFailed) as info:
                await client.call("toposm.queuemaster", body)
            assert (info.value.id, info.value.message, info.value.detail) == (raw["error"], raw["message"],
                                                                              raw.get("detail"))
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
    connection, exchange, _ = await _osm_client(bus.url)
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
    connection = await aio_pika.connect(bus.url)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=False)
        replies = await channel.declare_queue("", exclusive=True)
        bus.queuemaster()
        await _osm_wire_ready(connection)
        s = await _ask(exchange, replies, b'{"command": "stats"}')
        assert s["command"] == "stats"
    finally:
        await connection.close()


async def test_osm_wire_caps_message_size(bus, monkeypatch):
    """The osm wire refuses a body over the unit's max_body_bytes (here 64 KiB) with `too_large`."""
    monkeypatch.setenv("QBROKER_MAX_BODY_BYTES", str(64 * 1024))
    bus.queuemaster()
    connection, exchange, replies = await _osm_client(bus.url)
    try:
        await _osm_wire_ready(connection)
        big = json.dumps({"command": "stats", "pad": "x" * (128 * 1024)}).encode()
        refused = await _ask(exchange, replies, big)
        assert refused["status"] == "fail" and refused["error"] == "too_large"
        assert (await _ask(exchange, replies, b'{"command": "stats"}'))["command"] == "stats"
    finally:
        await connection.close()


class RawRenderer:
    """A render thread written from the seed's text alone, with plain aio-pika: JSON on ``osm``, its own queue
    as reply_to, listening at every level of the hierarchy. It answers our ``ping`` extension with ``pong``."""

    def __init__(self, tile_root, host="rawhost", pid=4242, threadid=0):
        self.tile_root, self.host, self.pid, self.threadid = tile_root, host, pid, threadid
        self.name = f"toposm.render.{host}.{pid}.{threadid}"
        self.rendered, self.pings = [], 0
        self.pinged = asyncio.Event()

    async def start(self, url):
        self.connection = await aio_pika.connect(url)
        self.channel = await self.connection.channel()
        self.exchange = await self.channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=True)
        self.queue = await self.channel.declare_queue("", exclusive=True)
        for key in ("toposm", "toposm.render", f"toposm.render.{self.host}",
                    f"toposm.render.{self.host}.{self.pid}", self.name):
            await self.queue.bind(self.exchange, routing_key=key)
        await self.queue.consume(self.on_message)
        await self.register()

    async def send(self, body):
        await self.exchange.publish(aio_pika.Message(json.dumps(body).encode(), content_type="application/json",
                                                     reply_to=self.queue.name), routing_key="toposm.queuemaster")

    async def register(self):
        await self.send({"command": "register", "hostname": self.host, "pid": self.pid,
                         "threadid": self.threadid, "strategy": "by_work_available"})

    async def on_message(self, message):
        async with message.process():
            body = json.loads(message.body)
            command = body.get("command")
            if command == "queuemaster online":
                await self.register()
            elif command == "render":
                z, mx, my = (int(v) for v in body["metatile"].split("/"))
                side = min(8, 2 ** z)
                for x in range(mx * 8, mx * 8 + side):
                    for y in range(my * 8, my * 8 + side):
                        path = self.tile_root / str(z) / str(x) / f"{y}.png"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        Image.new("RGB", (256, 256), (10, 200, 10)).save(path)
                self.rendered.append(body["metatile"])
                await self.send({"command": "rendered", "metatile": body["metatile"]})
            elif command == "ping":
                self.pings += 1
                self.pinged.set()
                await self.channel.default_exchange.publish(
                    aio_pika.Message(json.dumps({"command": "pong", "state": "idle"}).encode(),
                                     correlation_id=message.correlation_id), routing_key=message.reply_to)

    async def close(self):
        await self.connection.close()


async def test_a_renderer_on_the_seeds_raw_wire_works_next_to_qbroker_renderers(bus):
    bus.queuemaster()
    client = await bus.client()
    raw = RawRenderer(bus.tile_root)
    await raw.start(bus.url)
    try:
        s = await wait_renderers(client, 1)
        assert s["renderers"][0]["renderer"] == raw.name
        reply = await client.call("toposm.queuemaster", {"command": "render", "tile": "9/10/20"}, timeout=30)
        assert reply["metatile"] == "9/1/2" and raw.rendered == ["9/1/2"]
        await asyncio.wait_for(raw.pinged.wait(), 30)  # liveness reaches it on its own wire

        bus.renderer()  # a qbroker renderer beside it
        await wait_renderers(client, 2)
        tiles = [f"12/{8 * i}/{8 * i}" for i in range(1, 7)]
        replies = await asyncio.gather(*(client.call("toposm.queuemaster", {"command": "render", "tile": t},
                                                     timeout=60) for t in tiles))
        assert all(r["command"] == "rendered" for r in replies)
        by = {line["renderer"] for line in bus.render_log_lines()}
        assert raw.name in by and any(name != raw.name for name in by), by
        s = await stats(client)
        assert raw.name in {r["renderer"] for r in s["renderers"]}  # its pongs keep it registered
    finally:
        await raw.close()
