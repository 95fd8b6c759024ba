"""The raw aiormq contenders of bench/peers_rpc.py: the floors (``floor_seed``, ``floor_seed_queued``,
``floor_direct``) and ``qbroker_wire_aiormq``, qbroker's wire format on aiormq directly (bench/peers_rpc.py
says what each measures).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiormq
import orjson
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from bench.peers_rpc_contender import PAYLOAD, PAYLOAD_BYTES, Call, Stop

# -- raw aiormq floors ---------------------------------------------------------------------------------


class _Replies:
    """Futures by correlation id, resolved by a no-ack reply consumer."""

    def __init__(self) -> None:
        self.pending: dict[str, asyncio.Future[bytes]] = {}

    async def on_reply(self, message: DeliveredMessage) -> None:
        future = self.pending.pop(message.header.properties.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(message.body)

    def expect(self) -> tuple[str, asyncio.Future[bytes]]:
        message_id = uuid.uuid4().hex
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[message_id] = future
        return message_id, future


def _confirm_failed(future: asyncio.Future[bytes]) -> Callable[[asyncio.Future[Any]], None]:
    def check(publish: asyncio.Future[Any]) -> None:
        if publish.cancelled() or future.done():
            return
        exc = publish.exception()
        if exc is not None:
            future.set_exception(exc)
        elif not isinstance(publish.result(), Basic.Ack):
            future.set_exception(RuntimeError(f"request not confirmed: {publish.result()!r}"))

    return check


async def _declare_seed(channel: aiormq.abc.AbstractChannel) -> None:
    await channel.exchange_declare("rpc", exchange_type="topic")
    await channel.exchange_declare("reply", exchange_type="direct")


Answer = Callable[[DeliveredMessage], tuple[bytes, Basic.Properties]]


async def _seed_serve(url: str, answer: Answer, *, reply_channel: bool, queued: bool = False) -> Stop:
    """A server with the QBroker structure: ``rpc_bench.echo`` bound to the topic ``rpc`` exchange, each
    reply published (unconfirmed; on a channel of its own with ``reply_channel``) before the ack. With
    ``queued`` the reply and the ack are queued on the connection without awaiting their socket write
    (aiormq's ``wait=False``), as qbroker writes them; aiormq's default awaits each write."""
    connection = await aiormq.connect(url)
    consume = await connection.channel(publisher_confirms=False)
    publish = await connection.channel(publisher_confirms=False) if reply_channel else consume
    await consume.basic_qos(prefetch_count=256)
    await _declare_seed(consume)
    await consume.queue_declare("rpc_bench.echo")
    await consume.queue_bind("rpc_bench.echo", "rpc", routing_key="bench.echo")

    async def on_request(message: DeliveredMessage) -> None:
        body, properties = answer(message)
        await publish.basic_publish(
            body,
            exchange="reply",
            routing_key=message.header.properties.reply_to or "",
            properties=properties,
            wait=not queued,
        )
        await consume.basic_ack(message.delivery_tag or 0, wait=not queued)  # after the reply, as the protocol does

    await consume.basic_consume("rpc_bench.echo", on_request, no_ack=False)
    return connection.close


async def _seed_client(url: str) -> tuple[aiormq.abc.AbstractConnection, aiormq.abc.AbstractChannel, str, str]:
    """A client's connection, its confirming channel, its uuid and its reply queue bound to ``reply``."""
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    await _declare_seed(channel)
    me = uuid.uuid4().hex
    queue = (await channel.queue_declare("", exclusive=True, auto_delete=True)).queue or ""
    await channel.queue_bind(queue, "reply", routing_key=me)
    return connection, channel, me, queue


def _floor_answer(message: DeliveredMessage) -> tuple[bytes, Basic.Properties]:
    props = Basic.Properties(correlation_id=message.header.properties.message_id, content_type="application/json")
    return message.body, props


async def floor_seed_serve(url: str) -> Stop:
    return await _seed_serve(url, _floor_answer, reply_channel=False)


async def floor_seed_queued_serve(url: str) -> Stop:
    return await _seed_serve(url, _floor_answer, reply_channel=False, queued=True)


async def _floor_seed_client(url: str, *, queued: bool) -> tuple[Call, Stop]:
    connection, channel, me, queue = await _seed_client(url)
    replies = _Replies()
    await channel.basic_consume(queue, replies.on_reply, no_ack=True)

    async def call() -> object:
        message_id, future = replies.expect()
        properties = Basic.Properties(message_id=message_id, reply_to=me, content_type="application/json")
        publish = asyncio.ensure_future(
            channel.basic_publish(
                PAYLOAD_BYTES, exchange="rpc", routing_key="bench.echo", properties=properties, wait=not queued
            )
        )
        publish.add_done_callback(_confirm_failed(future))
        return await future

    return call, connection.close


async def floor_seed_connect(url: str) -> tuple[Call, Stop]:
    return await _floor_seed_client(url, queued=False)


async def floor_seed_queued_connect(url: str) -> tuple[Call, Stop]:
    return await _floor_seed_client(url, queued=True)


async def floor_direct_serve(url: str) -> Stop:
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=False)
    await channel.queue_declare("bench-echo")

    async def on_request(message: DeliveredMessage) -> None:
        props = message.header.properties
        await channel.basic_publish(
            message.body, routing_key=props.reply_to or "", properties=Basic.Properties(correlation_id=props.message_id)
        )

    await channel.basic_consume("bench-echo", on_request, no_ack=True)
    return connection.close


async def floor_direct_connect(url: str) -> tuple[Call, Stop]:
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=False)
    replies = _Replies()
    await channel.basic_consume("amq.rabbitmq.reply-to", replies.on_reply, no_ack=True)

    async def call() -> object:
        message_id, future = replies.expect()
        properties = Basic.Properties(message_id=message_id, reply_to="amq.rabbitmq.reply-to")
        await channel.basic_publish(PAYLOAD_BYTES, routing_key="bench-echo", properties=properties)
        return await future

    return call, connection.close


# -- qbroker's wire format on raw aiormq -----------------------------------------------------------------
# Not a peer: what qbroker would cost if its hot path spoke aiormq directly. The QBroker structure as in
# floor_seed, plus everything qbroker puts on and checks of each message: the header table (version, app,
# name, deadline), app-id, type, user-id, timestamp, expiration, JSON bodies encoded and decoded, replies
# written (without a confirm, as qbroker sends them) before the request's ack, writes queued as qbroker
# queues them.


def _wire_properties(kind: str, app: str, app_id: str, message_id: str, **extra: Any) -> Basic.Properties:
    headers: dict[str, Any] = {"version": 1, "app": app}
    if "name" in extra:
        headers["name"] = extra.pop("name")
    if "deadline" in extra:
        headers["deadline"] = extra.pop("deadline")
    return Basic.Properties(
        content_type="application/json",
        app_id=app_id,
        message_id=message_id,
        message_type=kind,
        user_id="guest",
        timestamp=datetime.now(tz=UTC),
        headers=headers,
        **extra,
    )


def _wire_check(message: DeliveredMessage) -> Any:
    props = message.header.properties
    headers = props.headers or {}
    if headers.get("version") != 1 or not props.message_id:
        raise ValueError("bad header")
    deadline = headers.get("deadline")
    if isinstance(deadline, int) and deadline / 1000 < time.time() - 1.0:
        raise ValueError("deadline passed")
    return orjson.loads(message.body) if message.body else None


async def wire_serve(url: str) -> Stop:
    me = uuid.uuid4().hex

    def answer(message: DeliveredMessage) -> tuple[bytes, Basic.Properties]:
        body = _wire_check(message)
        correlation_id = message.header.properties.message_id
        return orjson.dumps(body), _wire_properties(
            "reply", "bench.server", me, uuid.uuid4().hex, correlation_id=correlation_id
        )

    # Replies on a channel of their own and writes queued, as qbroker sends them.
    return await _seed_serve(url, answer, reply_channel=True, queued=True)


async def wire_connect(url: str) -> tuple[Call, Stop]:
    connection, channel, me, queue = await _seed_client(url)
    pending: dict[str, asyncio.Future[Any]] = {}

    async def on_reply(message: DeliveredMessage) -> None:
        future = pending.pop(message.header.properties.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(_wire_check(message))

    await channel.basic_consume(queue, on_reply, no_ack=True)

    async def call() -> object:
        message_id = uuid.uuid4().hex
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending[message_id] = future
        properties = _wire_properties(
            "rpc",
            "bench.client",
            me,
            message_id,
            reply_to=me,
            name="bench.echo",
            deadline=int((time.time() + 60) * 1000),
            expiration="59000",
        )
        publish = asyncio.ensure_future(
            channel.basic_publish(
                orjson.dumps(PAYLOAD), exchange="rpc", routing_key="bench.echo", properties=properties, wait=False
            )
        )
        publish.add_done_callback(_confirm_failed(future))
        return await future

    return call, connection.close
