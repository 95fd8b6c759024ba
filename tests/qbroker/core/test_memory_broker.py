"""The in-memory broker at the aio-pika level: routing, dead-lettering, TTL, redelivery, errors.

Unit-level behaviour on the memory broker (reconnects, failover, helpers) is in test_memory_units.py;
everything qbroker itself does is covered by the rest of tests/qbroker/core, which runs on both brokers.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from aio_pika.exceptions import ChannelInvalidStateError, ChannelNotFoundEntity, ChannelPreconditionFailed
from aiormq.exceptions import ChannelLockedResource

from harness import eventually
from qbroker.testing import MemoryBroker
from qbroker.testing.memory import DeliveredMessage, MemoryConnection, MemoryQueue, UnsupportedFeature, connect


@pytest.fixture
async def broker() -> AsyncIterator[MemoryBroker]:
    name = f"raw-{uuid.uuid4().hex[:12]}"
    yield MemoryBroker.named(name)
    MemoryBroker.discard(name)


@pytest.fixture
async def connection(broker: MemoryBroker) -> AsyncIterator[MemoryConnection]:
    conn = await connect(broker.url)
    yield conn
    await conn.close()


async def collect(queue: MemoryQueue, *, no_ack: bool = True) -> asyncio.Queue[DeliveredMessage]:
    received: asyncio.Queue[DeliveredMessage] = asyncio.Queue()
    await queue.consume(received.put, no_ack=no_ack)
    return received


def msg(body: bytes = b"x", **properties: Any) -> aio_pika.Message:
    return aio_pika.Message(body, **properties)


async def _append(into: list[DeliveredMessage], message: DeliveredMessage) -> None:
    into.append(message)


async def test_topic_direct_fanout_and_alternate_exchange(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    dead = await channel.declare_exchange("dead", aio_pika.ExchangeType.FANOUT)
    topic = await channel.declare_exchange("t", aio_pika.ExchangeType.TOPIC, arguments={"alternate-exchange": "dead"})
    direct = await channel.declare_exchange("d", aio_pika.ExchangeType.DIRECT)
    queues = {name: await channel.declare_queue(name) for name in ("hash", "star", "exact", "direct", "dead")}
    await queues["hash"].bind(topic, routing_key="render.#")
    await queues["star"].bind(topic, routing_key="*.vader")
    await queues["exact"].bind(topic, routing_key="render.vader")
    await queues["direct"].bind(direct, routing_key="uuid1")
    await queues["dead"].bind(dead)
    for key in ("render", "render.vader", "render.luke.1", "x.vader", "nothing.here"):
        await topic.publish(msg(key.encode()), routing_key=key)
    await direct.publish(msg(b"d1"), routing_key="uuid1")
    await direct.publish(msg(b"d2"), routing_key="uuid2")  # no binding, no alternate exchange: dropped
    bodies = {name: [m.body for m in connection.broker.messages(name)] for name in queues}
    assert bodies == {
        "hash": [b"render", b"render.vader", b"render.luke.1"],
        "star": [b"render.vader", b"x.vader"],
        "exact": [b"render.vader"],
        "direct": [b"d1"],
        "dead": [b"nothing.here"],
    }
    dead_letter = connection.broker.messages("dead")[0]
    assert (dead_letter.exchange, dead_letter.routing_key) == ("t", "nothing.here")


async def test_redeclare_with_other_settings_is_precondition_failed(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    await channel.declare_exchange("ex", aio_pika.ExchangeType.TOPIC, durable=True)
    await channel.declare_exchange("ex", aio_pika.ExchangeType.TOPIC, durable=True)  # same settings: fine
    with pytest.raises(ChannelPreconditionFailed, match="PRECONDITION_FAILED.*'type' for exchange 'ex'"):
        await channel.declare_exchange("ex", aio_pika.ExchangeType.DIRECT, durable=True)
    assert channel.is_closed  # RabbitMQ closes the channel on a channel error
    with pytest.raises(ChannelInvalidStateError):
        await channel.declare_queue("q")
    channel = await connection.channel()
    await channel.declare_queue("q", durable=True, arguments={"x-message-ttl": 1000})
    with pytest.raises(ChannelPreconditionFailed, match="inequivalent arg 'x-message-ttl' for queue 'q'"):
        await channel.declare_queue("q", durable=True, arguments={"x-message-ttl": 2000})
    channel = await connection.channel()
    with pytest.raises(ChannelNotFoundEntity, match="no exchange 'missing'"):
        await channel.get_exchange("missing")
    channel = await connection.channel()
    with pytest.raises(UnsupportedFeature, match="x-max-in-memory-bytes"):
        await channel.declare_queue("q2", arguments={"x-max-in-memory-bytes": 1000})


async def test_exclusive_and_auto_delete_queues(broker: MemoryBroker, connection: MemoryConnection) -> None:
    channel = await connection.channel()
    await channel.declare_queue("mine", exclusive=True)
    other = await connect(broker.url)
    with pytest.raises(ChannelLockedResource, match="RESOURCE_LOCKED"):
        await (await other.channel()).declare_queue("mine", exclusive=True)
    auto = await channel.declare_queue("auto", auto_delete=True)
    tag1 = await auto.consume(functools.partial(_append, []), no_ack=True)
    tag2 = await auto.consume(functools.partial(_append, []), no_ack=True)
    await auto.cancel(tag1)
    assert "auto" in broker.queue_names()
    await auto.cancel(tag2)  # the last consumer went away
    assert "auto" not in broker.queue_names()
    await connection.close()
    assert "mine" not in broker.queue_names()
    await (await other.channel()).declare_queue("mine", exclusive=True)  # free again
    await other.close()


async def test_unacked_messages_are_redelivered_when_the_channel_closes(connection: MemoryConnection) -> None:
    first = await connection.channel()
    await first.set_qos(prefetch_count=2)
    queue = await first.declare_queue("work")
    started: list[bytes] = []
    cancelled = asyncio.Event()

    async def stuck(message: DeliveredMessage) -> None:
        started.append(message.body)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await queue.consume(stuck)
    for n in range(3):
        await first.default_exchange.publish(msg(b"%d" % n), routing_key="work")
    await eventually(lambda: len(started) == 2)
    assert connection.broker.queue_info("work").unacked == 2
    assert connection.broker.message_count("work") == 1  # held back by the prefetch of 2
    await first.close()
    assert cancelled.is_set()  # like aio-pika, closing the channel cancels its running callbacks
    second = await connection.channel()
    received = await collect(await second.declare_queue("work"), no_ack=False)
    got = [await asyncio.wait_for(received.get(), 1) for _ in range(3)]
    assert [(m.body, m.redelivered) for m in got] == [(b"0", True), (b"1", True), (b"2", False)]
    await got[0].ack()
    with pytest.raises(aio_pika.exceptions.MessageProcessError):
        await got[0].ack()
    await second.close()
    with pytest.raises(ChannelInvalidStateError):
        await got[1].ack()


async def test_reject_and_expiry_dead_letter_with_x_death(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    dlx = await channel.declare_exchange("dlx", aio_pika.ExchangeType.FANOUT)
    dead = await channel.declare_queue("dead")
    await dead.bind(dlx)
    work_ex = await channel.declare_exchange("work_ex", aio_pika.ExchangeType.DIRECT)
    work = await channel.declare_queue("work", arguments={"x-dead-letter-exchange": "dlx"})
    await work.bind(work_ex, routing_key="job")
    await work_ex.publish(msg(b"doomed"), routing_key="job")
    received = await collect(work, no_ack=False)
    await (await asyncio.wait_for(received.get(), 1)).reject(requeue=False)
    [rejected] = connection.broker.messages("dead")
    death = rejected.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["exchange"], death["routing-keys"], death["count"]) == (
        "rejected",
        "work",
        "work_ex",
        ["job"],
        1,
    )
    assert rejected.exchange == "dlx" and rejected.headers["x-first-death-reason"] == "rejected"


async def test_message_expires_behind_a_blocked_head(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    dlx = await channel.declare_exchange("dlx", aio_pika.ExchangeType.FANOUT)
    dead = await channel.declare_queue("dead")
    await dead.bind(dlx)
    await channel.declare_queue("q", arguments={"x-dead-letter-exchange": "dlx"})
    await channel.default_exchange.publish(msg(b"long"), routing_key="q")  # no TTL, stays at the head
    await channel.default_exchange.publish(msg(b"short", expiration=0.1), routing_key="q")
    # "long" never leaves the head (nobody consumes), so reaching dead means expiry did not wait for it.
    await eventually(lambda: connection.broker.message_count("dead") == 1, timeout=30)
    [expired] = connection.broker.messages("dead")
    assert expired.body == b"short"
    assert expired.headers["x-death"][0]["reason"] == "expired"
    assert expired.headers["x-death"][0]["original-expiration"] == "100"
    assert expired.expiration_ms is None  # removed, or it would expire again in the dead queue
    assert [m.body for m in connection.broker.messages("q")] == [b"long"]


async def test_queue_ttl_and_max_length(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    dlx = await channel.declare_exchange("dlx", aio_pika.ExchangeType.FANOUT)
    dead = await channel.declare_queue("dead")
    await dead.bind(dlx)
    await channel.declare_queue("capped", arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 2})
    for n in range(3):
        await channel.default_exchange.publish(msg(b"%d" % n), routing_key="capped")
    assert [m.body for m in connection.broker.messages("capped")] == [b"1", b"2"]
    assert connection.broker.messages("dead")[0].headers["x-death"][0]["reason"] == "maxlen"
    await channel.declare_queue("ttl", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 50})
    await channel.default_exchange.publish(msg(b"t"), routing_key="ttl")
    await eventually(lambda: connection.broker.message_count("dead") == 2, timeout=1)
    assert connection.broker.message_count("ttl") == 0


async def test_priorities_prefetch_and_round_robin(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    await channel.declare_queue("prio", arguments={"x-max-priority": 5})
    for priority in (1, None, 9, 3):  # 9 is above the maximum and counts as 5
        await channel.default_exchange.publish(msg(str(priority).encode(), priority=priority), routing_key="prio")
    assert [m.body for m in connection.broker.messages("prio")] == [b"9", b"3", b"1", b"None"]
    await channel.set_qos(prefetch_count=1)
    queue = await channel.declare_queue("rr")
    seen: dict[str, list[DeliveredMessage]] = {"a": [], "b": []}
    for key in seen:
        await queue.consume(functools.partial(_append, seen[key]))
    for n in range(4):
        await channel.default_exchange.publish(msg(b"%d" % n), routing_key="rr")
    await eventually(lambda: len(seen["a"]) + len(seen["b"]) == 2)
    assert [m.body for m in seen["a"]] == [b"0"] and [m.body for m in seen["b"]] == [b"1"]
    assert connection.broker.message_count("rr") == 2  # each consumer holds its one prefetch slot
    await seen["b"][0].ack()
    await eventually(lambda: len(seen["b"]) == 2)
    assert [m.body for m in seen["b"]] == [b"1", b"2"]


async def test_single_active_consumer(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue("sac", arguments={"x-single-active-consumer": True})
    first: list[DeliveredMessage] = []
    second: list[DeliveredMessage] = []
    tag = await queue.consume(functools.partial(_append, first), no_ack=True)
    await queue.consume(functools.partial(_append, second), no_ack=True)
    for n in range(3):
        await channel.default_exchange.publish(msg(b"%d" % n), routing_key="sac")
    await eventually(lambda: len(first) == 3)
    await queue.cancel(tag)
    await channel.default_exchange.publish(msg(b"3"), routing_key="sac")
    await eventually(lambda: len(second) == 1)
    assert len(first) == 3


async def test_headers_are_copied_as_the_wire_would(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue("h")
    headers: dict[str, Any] = {"list": [1, "a"], "table": {"k": "v"}, "ratio": 0.1}
    await channel.default_exchange.publish(msg(headers=headers), routing_key="h")
    headers["table"]["k"] = "changed after publish"
    received = await collect(queue)
    message = await asyncio.wait_for(received.get(), 1)
    # AMQP tables carry Python floats as 32-bit floats (why qbroker sends its deadline as integer ms).
    assert message.headers == {"list": [1, "a"], "table": {"k": "v"}, "ratio": pytest.approx(0.1, abs=1e-8)}
    assert message.headers["ratio"] != 0.1
    for bad in ({"raw": b"bytes"}, {"pair": (1, 2)}):
        with pytest.raises(TypeError, match="Unknown type"):
            await channel.default_exchange.publish(msg(headers=bad), routing_key="h")
    with pytest.raises(TypeError, match="no_ack"):
        await message.ack()


async def test_expired_messages_do_not_pile_up_in_an_unconsumed_queue(connection: MemoryConnection) -> None:
    channel = await connection.channel()
    await channel.declare_queue("idle")
    await channel.default_exchange.publish(msg(b"fresh"), routing_key="idle")
    for _ in range(1500):
        await channel.default_exchange.publish(msg(expiration=0.01), routing_key="idle")
    await eventually(lambda: connection.broker.message_count("idle") == 1, timeout=2)
    queue = connection.broker.queues["idle"]
    assert sum(len(level) for level in queue._levels) < 1000  # expired entries were compacted away
    assert [m.body for m in connection.broker.messages("idle")] == [b"fresh"]
