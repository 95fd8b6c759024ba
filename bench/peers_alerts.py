"""The one-way contenders of bench/peers.py: qbroker alerts and a raw-aiormq one-way floor.

Both publish ``n`` alerts with publisher confirms, pipelined the same way (``window`` publishes in flight,
each awaiting its own confirm), to a topic exchange; one listener (prefetch 256, an ack per message)
counts them. The body says which run it belongs to and how many to expect, so the listener calls
``done(run)`` on the last one; the driver times first publish -> last delivery.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiormq
import orjson
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from qbroker import Config, Unit

Stop = Callable[[], Awaitable[object]]
Done = Callable[[str], None]
# publish(run, n, window): publish n alerts of run `run`, at most `window` unconfirmed at a time
Publish = Callable[[str, int, int], Awaitable[None]]


@dataclass(frozen=True)
class OneWay:
    name: str
    listen: Callable[[str, Done], Awaitable[Stop]]
    connect: Callable[[str], Awaitable[tuple[Publish, Stop]]]


class _Counter:
    def __init__(self, done: Done) -> None:
        self.done = done
        self.counts: dict[str, int] = {}

    def count(self, body: Any) -> None:
        run = str(body["run"])
        seen = self.counts.get(run, 0) + 1
        self.counts[run] = seen
        if seen == body["n"]:
            self.done(run)


async def _windowed(n: int, window: int, publish_one: Callable[[int], Awaitable[object]]) -> None:
    for start in range(0, n, window):
        await asyncio.gather(*(publish_one(i) for i in range(start, min(n, start + window))))


async def _qbroker_listen(url: str, done: Done) -> Stop:
    unit = Unit("bench.listener", config=Config(url=url))
    counter = _Counter(done)

    @unit.on_alert("bench.tick")
    async def tick(body: dict[str, Any]) -> None:
        counter.count(body)

    await unit.start()
    return unit.stop


async def _qbroker_connect(url: str) -> tuple[Publish, Stop]:
    unit = Unit("bench.alerter", config=Config(url=url))
    await unit.start()

    async def publish(run: str, n: int, window: int) -> None:
        await _windowed(n, window, lambda i: unit.alert("bench.tick", {"run": run, "n": n, "i": i}))

    return publish, unit.stop


async def _raw_listen(
    url: str, done: Done, check: Callable[[DeliveredMessage], None] | None = None, *, queued: bool = False
) -> Stop:
    """One raw aiormq listener (prefetch 256, an ack per message), checking each message with ``check``;
    with ``queued`` its acks are queued on the connection instead of awaited, as qbroker's are."""
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=False)
    await channel.basic_qos(prefetch_count=256)
    await channel.exchange_declare("alert", exchange_type="topic")
    queue = (await channel.queue_declare("", exclusive=True, auto_delete=True)).queue or ""
    await channel.queue_bind(queue, "alert", routing_key="bench.tick")
    counter = _Counter(done)

    async def on_alert(message: DeliveredMessage) -> None:
        if check is not None:
            check(message)
        counter.count(orjson.loads(message.body))
        await channel.basic_ack(message.delivery_tag or 0, wait=not queued)

    await channel.basic_consume(queue, on_alert, no_ack=False)
    return connection.close


async def _floor_listen(url: str, done: Done) -> Stop:
    return await _raw_listen(url, done)


async def _floor_connect(url: str) -> tuple[Publish, Stop]:
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.exchange_declare("alert", exchange_type="topic")

    async def publish(run: str, n: int, window: int) -> None:
        async def one(i: int) -> object:
            body = orjson.dumps({"run": run, "n": n, "i": i})
            confirm = await channel.basic_publish(
                body,
                exchange="alert",
                routing_key="bench.tick",
                properties=Basic.Properties(content_type="application/json"),
            )
            if not isinstance(confirm, Basic.Ack):
                raise RuntimeError(f"alert not confirmed: {confirm!r}")
            return confirm

        await _windowed(n, window, one)

    return publish, connection.close


# Not a peer: floor_oneway carrying qbroker's alert envelope (header table with version/app/name, app-id,
# message-id, type, user-id, timestamp) and checking it on arrival as qbroker does, its writes queued as
# qbroker's are: what qbroker's alerts would cost on raw aiormq with today's wire format.


def _wire_check(message: DeliveredMessage) -> None:
    props = message.header.properties
    headers = props.headers or {}
    if headers.get("version") != 1 or not props.message_id or not headers.get("name"):
        raise ValueError("bad header")


async def _wire_listen(url: str, done: Done) -> Stop:
    return await _raw_listen(url, done, _wire_check, queued=True)


async def _wire_connect(url: str) -> tuple[Publish, Stop]:
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.exchange_declare("alert", exchange_type="topic")
    me = uuid.uuid4().hex

    async def publish(run: str, n: int, window: int) -> None:
        async def one(i: int) -> object:
            body = orjson.dumps({"run": run, "n": n, "i": i})
            properties = Basic.Properties(
                content_type="application/json",
                app_id=me,
                message_id=uuid.uuid4().hex,
                message_type="alert",
                user_id="guest",
                timestamp=datetime.now(tz=UTC),
                headers={"version": 1, "app": "bench.alerter", "name": "bench.tick"},
            )
            confirm = await channel.basic_publish(
                body, exchange="alert", routing_key="bench.tick", properties=properties, wait=False
            )
            if not isinstance(confirm, Basic.Ack):
                raise RuntimeError(f"alert not confirmed: {confirm!r}")
            return confirm

        await _windowed(n, window, one)

    return publish, connection.close


ONE_WAY: dict[str, OneWay] = {
    c.name: c
    for c in (
        OneWay("qbroker", _qbroker_listen, _qbroker_connect),
        OneWay("floor_oneway", _floor_listen, _floor_connect),
        OneWay("qbroker_wire_oneway", _wire_listen, _wire_connect),
    )
}
