"""Fuzzing the seed's ``osm`` wire with malformed messages (a consumer kind beside the four of
tests/qbroker/core/test_fuzz.py; docs/reliability.md).

Short form by default (``QBROKER_FUZZ_COUNT``, 200); ``bench/chaos.py osm --count 10000`` is the long
form. Every command with a reply-to gets exactly one reply, errors carry a stable id, the osm queue holds
nothing ready or unacked afterwards, and the queuemaster still answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq
import orjson
import pytest
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from harness import HANG, eventually
from harness.broker import rabbitmqctl
from tests.fuzz_messages import generate

from .conftest import stats
from .seed_programs import osm_wire_ready

pytestmark = pytest.mark.fuzz

COUNT = int(os.environ.get("QBROKER_FUZZ_COUNT", "200"))
FUZZ_HANG = 2 * HANG + COUNT / 20
OSM_QUEUE = "toposm.queuemaster.osm"
STABLE_IDS = {
    "bad_message",
    "invalid_params",
    "unknown_command",
    "too_large",
    "busy",
    "forbidden",
    "invalid_tile",
    "unhandled",
}


def _waits(body: bytes) -> bool:
    """A well-formed `render` or `bulk` waits for a renderer (the seed wire has no deadline): no reply expected."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and parsed.get("command") in ("render", "bulk", "queuemaster online")


def osm_queue_counts(vhost: str) -> tuple[int, int]:
    out = rabbitmqctl(
        "list_queues", "-p", vhost, "-q", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged"
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == OSM_QUEUE:
            return int(parts[1]), int(parts[2])
    raise AssertionError(f"{OSM_QUEUE} not found")


async def test_fuzzed_osm_messages_are_all_settled_and_answered(bus) -> None:  # type: ignore[no-untyped-def]
    generated = await asyncio.to_thread(generate, COUNT, 1)
    bus.queuemaster()
    connection = await aiormq.connect(bus.url)
    replies: dict[str, list[DeliveredMessage]] = {}

    async def on_reply(message: DeliveredMessage) -> None:
        replies.setdefault(message.header.properties.correlation_id or "", []).append(message)

    try:
        channel = await connection.channel()
        await channel.exchange_declare("osm", exchange_type="topic", durable=True)
        declared = await channel.queue_declare("", exclusive=True)
        me = declared.queue
        await channel.basic_consume(me, on_reply, no_ack=True)
        client = await bus.client()
        await eventually(lambda: stats(client))
        ready_connection = await aio_pika.connect(bus.url)
        try:
            await osm_wire_ready(ready_connection)
        finally:
            await ready_connection.close()
        expected: set[str] = set()
        keys = ("toposm.queuemaster", "toposm.queuemaster", "expire_toposm", "toposm")
        for i, message in enumerate(generated):
            key = keys[i % len(keys)]
            token = uuid.uuid4().hex
            props = Basic.Properties(
                content_type=message.content_type,
                headers=message.headers,
                correlation_id=token,
                message_id=message.message_id,
                reply_to=me if message.wants_reply else None,
            )
            await channel.basic_publish(message.body, exchange="osm", routing_key=key, properties=props)
            if key == "toposm.queuemaster" and message.wants_reply and not _waits(message.body):
                expected.add(token)
        await eventually(
            lambda: expected <= set(replies),
            FUZZ_HANG,
            0.1,
            context=lambda: f"{len(expected - set(replies))} osm commands never answered",
        )
        vhost = unquote(urlsplit(bus.url).path.lstrip("/"))

        async def settled() -> bool:
            return await asyncio.to_thread(osm_queue_counts, vhost) == (0, 0)

        await eventually(
            settled, FUZZ_HANG, 0.5, context=lambda: f"{OSM_QUEUE}: ready, unacked = {osm_queue_counts(vhost)}"
        )
        doubles = {t: len(r) for t, r in replies.items() if len(r) > 1}
        assert not doubles, doubles
        errors = [json.loads(r[0].body) for t, r in replies.items() if t in expected]
        ids = {e.get("error") for e in errors if isinstance(e, dict) and "error" in e}
        assert ids <= STABLE_IDS, ids
        print(f"\nOSM-FUZZ: sent {len(generated)}, replies expected {len(expected)}, error ids {sorted(ids)}")
        assert (await stats(client))["command"] == "stats"  # still serving
    finally:
        await connection.close()
