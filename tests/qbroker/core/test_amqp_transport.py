"""The amqp transport's own message objects (``OutgoingMessage`` out, ``Delivery`` in) carry and read the
wire exactly as aio-pika's ``Message`` and ``IncomingMessage`` do: same properties, same settle errors."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from typing import Any

import aio_pika
import pytest
import structlog
from aio_pika.exceptions import ChannelInvalidStateError, MessageProcessError

from harness import HANG
from qbroker.amqp_transport import Delivery, connect_amqp
from qbroker.bus import Bus
from qbroker.config import Config
from qbroker.envelope import OutgoingMessage

FIELDS = (
    "body",
    "headers",
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "exchange",
    "routing_key",
    "redelivered",
    "consumer_tag",
    "delivery_tag",
)
PROPERTIES: dict[str, Any] = dict(
    headers={"version": 1, "name": "t.x", "deadline": 1795500000000, "nested": {"a": "b"}, "flag": True},
    content_type="application/json",
    content_encoding="identity",
    priority=3,
    correlation_id="c1",
    reply_to="r1",
    expiration=12.5,
    message_id="m1",
    type="rpc",
    user_id="guest",
    app_id="a1",
    timestamp=datetime.datetime(2026, 11, 24, 7, 0, tzinfo=datetime.UTC),
)


async def _receive(queue: Any) -> Any:
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def on_message(message: Any) -> None:
        if not got.done():
            got.set_result(message)

    await queue.consume(on_message)
    return await asyncio.wait_for(got, HANG)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["outgoing", "aio_pika"])
async def test_delivery_reads_what_incoming_message_reads(amqp_url: str, kind: str, persistent: bool) -> None:
    """Publish one message to two queues: one consumed through qbroker's transport, one through plain
    aio-pika. Every attribute a consumer reads is the same."""
    ours = await connect_amqp(amqp_url, timeout=HANG)
    plain = await aio_pika.connect(amqp_url)
    try:
        channel, plain_channel = await ours.channel(), await plain.channel()
        exchange = await channel.declare_exchange("t.fanout", aio_pika.ExchangeType.FANOUT, auto_delete=True)
        mine = await channel.declare_queue(exclusive=True)
        theirs = await plain_channel.declare_queue(exclusive=True)
        await mine.bind(exchange)
        await theirs.bind("t.fanout")
        delivery_mode = 2 if persistent else 1
        message = (
            OutgoingMessage(b'{"n": 1}', delivery_mode=delivery_mode, **PROPERTIES)
            if kind == "outgoing"
            else aio_pika.Message(b'{"n": 1}', delivery_mode=delivery_mode, **PROPERTIES)
        )
        await exchange.publish(message, routing_key="t.key")
        delivered, incoming = await asyncio.gather(_receive(mine), _receive(theirs))
        assert isinstance(delivered, Delivery)
        for field in FIELDS:
            if field in ("consumer_tag", "delivery_tag"):
                assert getattr(delivered, field), field
                continue
            assert getattr(delivered, field) == getattr(incoming, field), field
        assert (delivered.delivery_mode == 2) is persistent
        await delivered.ack()
        await incoming.ack()
    finally:
        await ours.close()
        await plain.close()


async def test_settling_errors_are_aio_pikas(amqp_url: str) -> None:
    connection = await connect_amqp(amqp_url, timeout=HANG)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        for n in range(2):
            await channel.default_exchange.publish(OutgoingMessage(str(n).encode()), routing_key=queue.name)
        received: asyncio.Queue[Any] = asyncio.Queue()
        await queue.consume(received.put)
        message = await asyncio.wait_for(received.get(), HANG)
        await message.ack()
        assert message.processed
        with pytest.raises(MessageProcessError):
            await message.ack()
        with pytest.raises(MessageProcessError):
            await message.reject()

        second = await asyncio.wait_for(received.get(), HANG)
        await channel.close()
        with pytest.raises(ChannelInvalidStateError):
            await second.ack()

        no_ack_channel = await connection.channel()
        no_ack_queue = await no_ack_channel.declare_queue(exclusive=True)
        await no_ack_channel.default_exchange.publish(OutgoingMessage(b"x"), routing_key=no_ack_queue.name)
        got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await no_ack_queue.consume(got.set_result, no_ack=True)  # a plain function works too
        unsettleable = await asyncio.wait_for(got, HANG)
        assert unsettleable.processed and unsettleable.body == b"x"
        with pytest.raises(TypeError):
            await unsettleable.ack()
    finally:
        await connection.close()


async def test_acks_queued_on_the_connection_reach_the_broker_by_a_flush(amqp_url: str) -> None:
    # Acks (and replies) are queued, not awaited until written, and closing a connection drops what is
    # still queued (here ~5% of a burst of 200 acks without the flush): Bus.flush, which a unit's stop
    # runs before it closes, is what gets them out.
    bus = Bus(
        Config(url=amqp_url),
        app="test.flush",
        uuid=uuid.uuid4().hex,
        log=structlog.get_logger(),
        on_connected=lambda _: asyncio.sleep(0),
    )
    await bus.start()
    try:
        assert await bus.wait_connected(HANG)
        connection = bus.connection
        assert connection is not None
        channel = await connection.channel()
        queue = await channel.declare_queue("t.flush")
        for n in range(200):
            await channel.default_exchange.publish(aio_pika.Message(str(n).encode()), routing_key="t.flush")
        deliveries: list[Delivery] = []
        all_in = asyncio.Event()

        async def on_message(message: Delivery) -> None:
            deliveries.append(message)
            if len(deliveries) == 200:
                all_in.set()

        await queue.consume(on_message)
        await asyncio.wait_for(all_in.wait(), HANG)
        for delivery in deliveries:
            await delivery.ack()
        await bus.flush(HANG)
        await connection.close()
    finally:
        await bus.close("test over")
    # A dropped ack would have put its message back in the queue.
    check = await connect_amqp(amqp_url, timeout=HANG)
    try:
        channel = await check.channel()
        declared = await channel.declare_queue("t.flush", passive=True)
        assert declared.declaration_result.message_count == 0  # type: ignore[attr-defined]
        await channel.queue_delete("t.flush")
    finally:
        await check.close()
