"""Fuzzing every consumer kind with malformed messages from a raw client (hypothesis-generated).

Short form in the normal run (``QBROKER_FUZZ_COUNT``, default 200 messages per kind); the long form
(10,000 each) is ``QBROKER_FUZZ_COUNT=10000`` or ``bench/chaos.py fuzz``. Afterwards: no consumer holds an
unacked message (rabbitmqctl), every request with a reply-to got exactly one reply, each error reply has
a stable id from the registry, and the unit still serves.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from typing import Any
from urllib.parse import unquote, urlsplit

import aiormq
import pytest
from aiormq.abc import DeliveredMessage

from harness import HANG, eventually
from harness.broker import rabbitmqctl
from qbroker import RequestContext
from qbroker.errors import _registry
from tests.conftest import MakeUnit
from tests.fuzz_messages import Fuzzed, generate
from tests.seed_client import decoded

pytestmark = [pytest.mark.rabbitmq_only, pytest.mark.fuzz]

COUNT = int(os.environ.get("QBROKER_FUZZ_COUNT", "200"))
FUZZ_HANG = 2 * HANG + COUNT / 20
# Ids a malformed message may be answered with: the registry, plus BadMessage's per-problem ids.
STABLE_IDS = set(_registry) | {"bad_header", "bad_version", "bad_body", "too_large", "dead_letter", "rejected"}
KINDS = ("rpc", "alert", "reply", "dead")


def queue_counts(vhost: str, prefix: str) -> dict[str, tuple[int, int]]:
    out = rabbitmqctl(
        "list_queues", "-p", vhost, "-q", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged"
    ).stdout
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            counts[parts[0]] = (int(parts[1]), int(parts[2]))
    # dead.kept holds the operators' copies of dead requests by design (nobody consumes it): not unsettled
    return {name: c for name, c in counts.items() if name.startswith(prefix) and name != f"{prefix}dead.kept"}


async def test_fuzzed_messages_are_all_settled_and_answered(make_unit: MakeUnit, amqp_url: str) -> None:
    generated = await asyncio.to_thread(generate, COUNT)
    prefix = f"fuzz-{uuid.uuid4().hex[:8]}."
    server = await make_unit("test.fuzz", exchange_prefix=prefix, max_body_bytes=4096)

    @server.rpc("t.fuzz")
    async def fuzz(n: int, ctx: RequestContext) -> int:
        return n

    @server.rpc("t.sync")
    def sync(n: int = 0) -> int:
        return n

    commands = server.commands("t.cmd")

    @commands.command("stats")
    async def stats() -> dict[str, Any]:
        return {"ok": True}

    @server.on_alert("fuzz.#")
    async def heard(body: Any = None) -> str:
        return "heard"

    await server.start()
    vhost = unquote(urlsplit(amqp_url).path.lstrip("/"))
    connection = await aiormq.connect(amqp_url)
    replies: dict[str, list[DeliveredMessage]] = {}

    async def on_reply(message: DeliveredMessage) -> None:
        key = message.header.properties.correlation_id or ""
        replies.setdefault(key, []).append(message)

    try:
        channel = await connection.channel()
        me = uuid.uuid4().hex
        await channel.queue_declare(f"{prefix}reply_{me}", exclusive=True, auto_delete=True)
        await channel.queue_bind(f"{prefix}reply_{me}", f"{prefix}reply", routing_key=me)
        await channel.basic_consume(f"{prefix}reply_{me}", on_reply, no_ack=True)
        expected: dict[str, str] = {}  # token -> kind, for messages that must get exactly one reply
        sent: Counter[str] = Counter()
        unencodable = 0
        routes = {
            "rpc": ["t.fuzz", "t.sync", "t.cmd", "t.absent"],
            "alert": ["fuzz.x"],
            "reply": [server.uuid],
            "dead": ["t.fuzz"],
        }
        for kind in KINDS:
            for i, original in enumerate(generated):
                message = Fuzzed(**{**original.__dict__, "token": uuid.uuid4().hex})
                key = routes[kind][i % len(routes[kind])]
                try:
                    await channel.basic_publish(
                        message.body, exchange=prefix + kind, routing_key=key, properties=message.properties(me)
                    )
                except (aiormq.exceptions.AMQPError, ValueError, TypeError, OverflowError, UnicodeError):
                    unencodable += 1  # pamqp could not encode it: not a message the broker ever sees
                    if channel.is_closed:
                        channel = await connection.channel()
                    continue
                sent[kind] += 1
                if message.wants_reply and kind in ("rpc", "alert"):
                    expected[message.token] = kind

        def missing() -> list[str]:
            return [t for t in expected if t not in replies]

        await eventually(
            lambda: not missing(),
            FUZZ_HANG,
            0.1,
            context=lambda: f"{len(missing())} requests never answered, e.g. {missing()[:3]}",
        )

        # Every consumer has settled everything: nothing ready in our queues, nothing unacked anywhere.
        async def settled() -> bool:
            counts = await asyncio.to_thread(queue_counts, vhost, prefix)
            return all(c == (0, 0) for c in counts.values())

        await eventually(
            settled, FUZZ_HANG, 0.5, context=lambda: f"messages left unsettled: {queue_counts(vhost, prefix)}"
        )
        doubles = {t: len(r) for t, r in replies.items() if len(r) > 1}
        collected = server.dead_letters.stats() if server.dead_letters is not None else {}
        assert collected.get("kept_failed", 0) == 0, f"dead requests whose copy could not be kept: {collected}"
        assert not doubles, f"requests answered more than once: {doubles}"
        ids: Counter[str] = Counter()
        for token, got in replies.items():
            error = decoded(dict(got[0].header.properties.headers or {})).get("error")
            if error is not None:
                assert error["status"] in ("error", "fail"), error
                assert error["id"] in STABLE_IDS, error
                ids[error["id"]] += 1
        print(
            f"fuzz: sent {dict(sent)}, unencodable {unencodable}, expected replies {len(expected)}, "
            f"answered {len(replies)}, "
            f"error ids {dict(ids)}"
        )
        assert all(sent[k] >= COUNT // 2 for k in KINDS), sent
    finally:
        await connection.close()
    client = await make_unit("test.client", exchange_prefix=prefix)
    await client.start()
    assert await client.call("t.fuzz", {"n": 7}) == 7  # still serving
    assert await client.call("t.sync", {"n": 8}) == 8
