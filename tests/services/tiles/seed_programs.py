"""Programs written from the TopOSM protocol text alone (toposm-message-protocol.md), with plain aio-pika
and no qbroker import: JSON on the ``osm`` exchange, the sender's own queue as ``reply_to``, expirations as
``z/x/y;...`` on ``expire_toposm``. What they do is only what the seed defines, as the text allows it: no
content type (the text names none), reply queues named as the program likes, extra fields in a command,
and every message the text does not define counted as unknown (nothing is exempt)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage, AbstractQueue
from PIL import Image

from harness import eventually

# How a seed program declares `osm`: the text says nothing of the exchange's flags; a program does as the
# project's docs tell it (docs/tiles.md, "The TopOSM wire"). One switch for every program here.
SEED_OSM_EXCHANGE_DURABLE = True


async def declare_osm(channel: aio_pika.abc.AbstractChannel) -> AbstractExchange:
    return await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=SEED_OSM_EXCHANGE_DURABLE)


async def osm_client(url: str, reply_queue: str = "") -> tuple[AbstractConnection, AbstractExchange, AbstractQueue]:
    """A requester: ``osm`` and its reply queue (broker-named, or ``reply_queue`` as the program chose)."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    exchange = await declare_osm(channel)
    replies = await channel.declare_queue(reply_queue, exclusive=True)
    return connection, exchange, replies


async def osm_wire_ready(connection: AbstractConnection) -> None:
    """The queuemaster consumes its osm queue (it declares it after its qbroker endpoint already answers)."""

    async def consumed() -> bool:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue("toposm.queuemaster.osm", passive=True)
            return bool(queue.declaration_result.consumer_count)
        except aio_pika.exceptions.ChannelClosed:  # not declared yet
            return False
        finally:
            if not channel.is_closed:
                await channel.close()

    await eventually(consumed)


async def ask(
    exchange: AbstractExchange,
    replies: AbstractQueue,
    body: bytes,
    timeout: float = 20.0,
    routing_key: str = "toposm.queuemaster",
) -> Any:
    """Publish a command with ``replies`` as reply_to and return the answer with its correlation id."""
    correlation_id = uuid.uuid4().hex
    await exchange.publish(
        aio_pika.Message(body, reply_to=replies.name, correlation_id=correlation_id), routing_key=routing_key
    )
    async with replies.iterator(timeout=timeout) as it:
        async for message in it:
            async with message.process():
                if message.correlation_id == correlation_id:
                    return json.loads(message.body)
    return None


class SeedRenderThread:
    """A render thread from the seed's text: its own exclusive queue (broker-named, or ``queue_name``), bound
    at every level of the hierarchy and used as reply_to; it answers ``queuemaster online`` with ``register``
    and ``render`` with ``rendered``, and nothing else. The text defines no other message to a renderer, no
    answer to ``register`` or ``rendered`` among them: anything else it gets (a ``ping``, a ``registered``)
    is counted in ``unknown`` and ignored. ``extra`` goes into its ``register`` (the text's
    ``{"command": ..., <parameters>}`` leaves a program free to say more)."""

    def __init__(
        self,
        tile_root: Path,
        host: str = "rawhost",
        pid: int = 4242,
        threadid: int = 0,
        queue_name: str = "",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.tile_root, self.host, self.pid, self.threadid = tile_root, host, pid, threadid
        self.name = f"toposm.render.{host}.{pid}.{threadid}"
        self.queue_name = queue_name
        self.extra = extra or {}
        self.rendered: list[str] = []
        self.unknown: list[str] = []

    async def start(self, url: str) -> None:
        self.connection = await aio_pika.connect(url)
        self.channel = await self.connection.channel()
        self.exchange = await declare_osm(self.channel)
        self.queue = await self.channel.declare_queue(self.queue_name, exclusive=True)
        for key in (
            "toposm",
            "toposm.render",
            f"toposm.render.{self.host}",
            f"toposm.render.{self.host}.{self.pid}",
            self.name,
        ):
            await self.queue.bind(self.exchange, routing_key=key)
        await self.queue.consume(self.on_message)
        await self.register()

    async def send(self, body: dict[str, Any]) -> None:
        await self.exchange.publish(
            aio_pika.Message(json.dumps(body).encode(), reply_to=self.queue.name), routing_key="toposm.queuemaster"
        )

    async def register(self) -> None:
        await self.send(
            {
                "command": "register",
                "hostname": self.host,
                "pid": self.pid,
                "threadid": self.threadid,
                "strategy": "by_work_available",
                **self.extra,
            }
        )

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        async with message.process():
            try:
                body = json.loads(message.body)
            except ValueError:
                body = None
            command = body.get("command") if isinstance(body, dict) else repr(message.body[:64])
            if command == "queuemaster online":
                await self.register()
            elif command == "render":
                z, mx, my = (int(v) for v in body["metatile"].split("/"))
                side = min(8, 2**z)
                for x in range(mx * 8, mx * 8 + side):
                    for y in range(my * 8, my * 8 + side):
                        path = self.tile_root / str(z) / str(x) / f"{y}.png"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        Image.new("RGB", (256, 256), (10, 200, 10)).save(path)
                self.rendered.append(body["metatile"])
                await self.send({"command": "rendered", "metatile": body["metatile"]})
            else:
                self.unknown.append(str(command))

    async def close(self) -> None:
        await self.connection.close()


async def wait_for_message(queue: AbstractQueue, timeout: float = 20.0) -> AbstractIncomingMessage:
    """The next message on ``queue`` (acked); the timeout only catches hangs."""
    async with queue.iterator(timeout=timeout) as it:
        async for message in it:
            await message.ack()
            return message
    raise AssertionError("no message")


async def osm_listener(exchange: AbstractExchange, routing_key: str) -> list[str]:
    """Bodies heard on ``osm`` under ``routing_key``, as a seed program hears them (its own exclusive
    queue, bound to that key only)."""
    heard: list[str] = []
    queue = await exchange.channel.declare_queue("", exclusive=True)
    await queue.bind(exchange, routing_key=routing_key)

    async def on_message(message: AbstractIncomingMessage) -> None:
        async with message.process():
            heard.append(message.body.decode())

    await queue.consume(on_message)
    return heard
