"""A unit on a bus where another program declared the shared exchanges and queues first, with other settings.

The other program is the original QBroker (trio_qbroker), reproduced declaration for declaration as its
``conn.py`` makes them (its names, with this test's exchange prefix): ``alert`` a topic exchange without an
alternate exchange; ``rpc`` a topic exchange with ``dead`` as alternate; ``reply`` direct; with its
dead-letter collector, ``dead`` a *topic* exchange and a ``deadrpc`` queue bound with ``#``; a server's
``rpc_<name>`` non-durable, auto-deleted, with a 10 s message TTL. Each used to stop a qbroker unit with
PRECONDITION_FAILED; now the unit starts, uses what exists and warns once per difference, naming its cost.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aio_pika
import pytest
import structlog

from harness import HANG
from qbroker import NoServer, QBrokerError, Unit
from qbroker.transport import Channel
from tests.conftest import MakeUnit

WARNING = "shared object exists with other settings; used as it is"
# What the original's dead-letter collector answers (captured from trio_qbroker 4a46a50 on RabbitMQ 3.10): its
# own error element, in its own codec, which qbroker cannot read.
ORIGINAL_DEAD_ANSWER = {
    "debug": False,
    "version": 1,
    "error": {
        "s": "error",
        "m": "Dead: queue=rpc route=t.nobody",
        "c": "DeadLettered",
        "_o": "m_err",
        "e": {
            "e": "trio_qbroker.conn.DeadLettered",
            "a0": "rpc",
            "a1": "t.nobody",
            "_o": "exc",
            "r": "DeadLettered('rpc', 't.nobody')",
            "s": "Dead: queue=rpc route=t.nobody",
        },
    },
}


async def _channel(make_unit: MakeUnit) -> Channel:
    """A raw channel on the test's broker (a unit on a prefix of its own lends its connection)."""
    helper = await make_unit("test.helper", exchange_prefix=f"t.helper.{uuid.uuid4().hex[:8]}.", dead_letters=False)
    await helper.start()
    assert helper.connection is not None
    return await helper.connection.channel(publisher_confirms=False)


async def declare_like_the_original(channel: Channel, prefix: str, *, dead_collector: bool) -> None:
    await channel.declare_exchange(prefix + "alert", "topic", durable=True, arguments={})
    await channel.declare_exchange(
        prefix + "rpc", "topic", durable=True, arguments={"alternate-exchange": prefix + "dead"}
    )
    await channel.declare_exchange(prefix + "reply", "direct", durable=True, arguments={})
    if dead_collector:
        await channel.declare_exchange(prefix + "dead", "topic", durable=True, arguments={})
        queue = await channel.declare_queue(prefix + "deadrpc", auto_delete=True, arguments={})
        await queue.bind(prefix + "dead", routing_key="#")


def _warned(logs: list[dict[str, Any]]) -> dict[str, str]:
    """difference -> cost, of every difference warned about."""
    return {entry["difference"]: entry["cost"] for entry in logs if entry["event"] == WARNING}


async def _start(unit: Unit) -> list[dict[str, Any]]:
    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(unit.start(), HANG)
    return logs


async def test_a_unit_starts_where_the_original_and_its_collector_declared_first(make_unit: MakeUnit) -> None:
    prefix = f"t.orig.{uuid.uuid4().hex[:8]}."
    await declare_like_the_original(await _channel(make_unit), prefix, dead_collector=True)
    unit = await make_unit("test.beside", exchange_prefix=prefix)
    warned = _warned(await _start(unit))
    assert warned == {
        f"exchange '{prefix}dead': type is 'topic' there, qbroker declares 'fanout'": (
            "none: the dead queue is bound with '#', so a topic exchange gives it every key"
        ),
        f"exchange '{prefix}alert': alternate-exchange is none there, qbroker declares '{prefix}dead'": (
            "alerts nobody listens to are dropped unseen instead of counted as dead"
        ),
    }
    with pytest.raises(NoServer):  # our collector answers through the original's topic `dead`
        await unit.call("t.nobody", timeout=HANG)


async def test_a_unit_starts_where_the_original_without_a_collector_declared_first(make_unit: MakeUnit) -> None:
    prefix = f"t.orig.{uuid.uuid4().hex[:8]}."
    await declare_like_the_original(await _channel(make_unit), prefix, dead_collector=False)
    unit = await make_unit("test.beside", exchange_prefix=prefix)
    warned = _warned(await _start(unit))
    assert list(warned) == [
        f"exchange '{prefix}alert': alternate-exchange is none there, qbroker declares '{prefix}dead'"
    ]
    with pytest.raises(NoServer):
        await unit.call("t.nobody", timeout=HANG)


async def test_a_name_the_original_serves_too_is_served_from_its_queue(make_unit: MakeUnit) -> None:
    prefix = f"t.orig.{uuid.uuid4().hex[:8]}."
    channel = await _channel(make_unit)
    await declare_like_the_original(channel, prefix, dead_collector=False)
    queue = await channel.declare_queue(
        f"{prefix}rpc_t.both",
        auto_delete=True,
        arguments={"x-dead-letter-exchange": prefix + "dead", "x-message-ttl": 10_000},
    )
    await queue.bind(prefix + "rpc", routing_key="t.both")
    server = await make_unit("test.server", exchange_prefix=prefix)

    @server.rpc("t.both")
    async def both() -> str:
        return "qbroker"

    warned = _warned(await _start(server))
    queue_warnings = {
        difference.split(":")[1].split()[0]: cost
        for difference, cost in warned.items()
        if difference.startswith(f"queue '{prefix}rpc_t.both'")
    }
    assert set(queue_warnings) == {"durable", "auto_delete", "x-expires", "x-message-ttl"}
    assert queue_warnings["x-message-ttl"] == "messages waiting longer than 10000 ms are dropped or dead-lettered"
    client = await make_unit("test.client", exchange_prefix=prefix)
    await client.start()
    assert await client.call("t.both", timeout=HANG) == "qbroker"


async def _foreign_collector(channel: Channel, prefix: str, answer: dict[str, Any], answered: asyncio.Event) -> None:
    """Another program's dead-letter collector on the original's `deadrpc` queue: answers every dead request
    at once with ``answer`` (its headers), in the original's codec."""
    reply = await channel.get_exchange(prefix + "reply", ensure=False)

    async def on_dead(message: Any) -> None:
        await reply.publish(
            aio_pika.Message(
                b"null",
                headers=answer,
                content_type="application/json+obj",
                correlation_id=message.message_id,
                type="reply",
            ),
            routing_key=message.reply_to,
        )
        await message.ack()
        answered.set()

    queue = await channel.declare_queue(prefix + "deadrpc", passive=True)
    await queue.consume(on_dead)


async def test_two_collectors_leave_the_caller_one_answer_it_can_read(make_unit: MakeUnit) -> None:
    """The original's collector answers a dead request first, in a form qbroker cannot read; qbroker's collector
    answers it too: the caller ends with the readable answer."""
    prefix = f"t.orig.{uuid.uuid4().hex[:8]}."
    channel = await _channel(make_unit)
    await declare_like_the_original(channel, prefix, dead_collector=True)
    answered = asyncio.Event()
    await _foreign_collector(channel, prefix, ORIGINAL_DEAD_ANSWER, answered)
    # No collector of ours yet; a call holds an unreadable answer (here for as long as the test may take).
    caller = await make_unit("test.caller", exchange_prefix=prefix, dead_letters=False, unreadable_reply_grace=HANG)
    await caller.start()
    call = asyncio.ensure_future(caller.call("t.nobody", timeout=HANG))
    await asyncio.wait_for(answered.wait(), HANG)  # the foreign answer is on its way first
    collector = await make_unit("test.collector", exchange_prefix=prefix)
    await collector.start()  # takes the dead request waiting in `dead` and answers it
    with pytest.raises(QBrokerError) as info:
        await call
    assert info.value.part != "qbroker.reply"  # an answer read, not a reading failure (qbroker's: no_server)


async def test_an_unreadable_answer_alone_still_answers_the_call(make_unit: MakeUnit) -> None:
    prefix = f"t.orig.{uuid.uuid4().hex[:8]}."
    channel = await _channel(make_unit)
    await declare_like_the_original(channel, prefix, dead_collector=True)
    answered = asyncio.Event()
    await _foreign_collector(channel, prefix, {"error": "not an error element"}, answered)
    caller = await make_unit("test.caller", exchange_prefix=prefix, dead_letters=False, unreadable_reply_grace=0.05)
    await caller.start()
    with pytest.raises(QBrokerError) as info:
        await caller.call("t.nobody", timeout=HANG)
    assert info.value.part == "qbroker.reply" and info.value.id != "call_timeout"
