"""Programs written from the TopOSM protocol text alone (toposm-message-protocol.md), with plain aio-pika
and no qbroker import: JSON on the ``osm`` exchange, the sender's own queue as ``reply_to``, expirations as
``z/x/y;...`` on ``expire_toposm``. What they do is only what the seed defines."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage, AbstractQueue
from PIL import Image

from harness import eventually


async def osm_client(url: str) -> tuple[AbstractConnection, AbstractExchange, AbstractQueue]:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    exchange = await channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=True)
    replies = await channel.declare_queue("", exclusive=True)
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


async def ask(exchange: AbstractExchange, replies: AbstractQueue, body: bytes, timeout: float = 20.0,
              routing_key: str = "toposm.queuemaster") -> Any:
    """Publish a command with ``replies`` as reply_to and return the answer with its correlation id."""
    correlation_id = uuid.uuid4().hex
    await exchange.publish(aio_pika.Message(body, content_type="application/json", reply_to=replies.name,
                                            correlation_id=correlation_id), routing_key=routing_key)
    async with replies.iterator(timeout=timeout) as it:
        async for message in it:
            async with message.process():
                if message.correlation_id == correlation_id:
                    return json.loads(message.body)
    return None


class SeedRenderThread:
    """A render thread from the seed's text: its own exclusive queue, bound at every level of the hierarchy
    and used as reply_to; it answers ``queuemaster online`` with ``register`` and ``render`` with
    ``rendered``, and nothing else (an unknown command, such as a ``ping``, is counted and ignored)."""

    def __init__(self, tile_root: Path, host: str = "rawhost", pid: int = 4242, threadid: int = 0) -> None:
        self.tile_root, self.host, self.pid, self.threadid = tile_root, host, pid, threadid
        self.name = f"toposm.render.{host}.{pid}.{threadid}"
        self.rendered: list[str] = []
        self.unknown: list[str] = []

    async def start(self, url: str) -> None:
        self.connection = await aio_pika.connect(url)
        self.channel = await self.connection.channel()
        self.exchange = await self.channel.declare_exchange("osm", aio_pika.ExchangeType.TOPIC, durable=True)
        self.queue = await self.channel.declare_queue("", exclusive=True)
        for key in ("toposm", "toposm.render", f"toposm.render.{self.host}",
                    f"toposm.render.{self.host}.{self.pid}", self.name):
            await self.queue.bind(self.exchange, routing_key=key)
        await self.queue.consume(self.on_message)
        await self.register()

    async def send(self, body: dict[str, Any]) -> None:
        await self.exchange.publish(aio_pika.Message(json.dumps(body).encode(), content_type="application/json",
                                                     reply_to=self.queue.name), routing_key="toposm.queuemaster")

    async def register(self) -> None:
        await self.send({"command": "register", "hostname": self.host, "pid": self.pid,
                         "threadid": self.threadid, "strategy": "by_work_available"})

    async def on_message(self, message: AbstractIncomingMessage) -> None:
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
            elif command not in ("registered", "ack"):  # the queuemaster's answers to our own commands
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
