"""One (status, id, part) triple, one message (the seed): the specifics of a bad request are in `detail`.
Several bad requests of each kind, to the queuemaster on both wires and to a renderer; the Spark bridge's
side is in tests/services/spark_bridge/test_spark_bridge_bus.py."""

import ast
import json
from collections import defaultdict
from pathlib import Path

import pytest

from qbroker import QBrokerError
from services.toposm.error_messages import MESSAGES

from .conftest import wait_renderers
from .seed_programs import ask, osm_client, osm_wire_ready

BAD_QUEUEMASTER_REQUESTS = [
    {"command": "render", "tile": "12/99999/0"},
    {"command": "render", "tile": "3/9/9"},
    {"command": "render", "tile": "99/0/0"},
    {"command": "render", "tile": "9/10"},
    {"command": "render"},
    {"command": "expire", "tiles": "9/1/1;9/9999/0"},
    {"command": "expire", "tiles": "5/99/0"},
    {"command": "rendered", "metatile": "9/9999/0", "status": "ok"},
    {"command": "rendered", "metatile": "4/77/0", "status": "ok"},
    {"command": "register", "hostname": "h", "pid": 1, "threadid": 0, "strategy": "nonsense"},
    {"command": "bulk", "metatile": "9/9999/0"},
    {"command": "bulk", "metatile": "12/0/0", "priority": "urgent"},
    {"command": "cancel", "metatiles": []},
    {"command": "cancel", "metatiles": ["4/77/0"]},
    {"command": "dance"},
    {"command": "sing"},
]


def _collect(messages, status, error_id, part, message, detail):
    messages[(status, error_id, part)].add(message)
    return detail


async def test_each_error_triple_has_one_message(bus):
    bus.queuemaster()
    bus.renderer()
    client = await bus.client()
    await wait_renderers(client, 1)
    messages: dict[tuple, set[str]] = defaultdict(set)
    details = []
    for body in BAD_QUEUEMASTER_REQUESTS:
        with pytest.raises(QBrokerError) as info:
            await client.call("toposm.queuemaster", body, timeout=10)
        e = info.value
        details.append(_collect(messages, e.status, e.id, e.part, e.message, e.detail))
    renderer = (await client.call("toposm.queuemaster", {"command": "stats"}))["renderers"][0]["renderer"]
    for metatile in ("9/9999/0", "nonsense", "99/0/0"):  # a renderer's own validation
        with pytest.raises(QBrokerError) as info:
            await client.call(renderer, {"command": "render", "metatile": metatile}, timeout=10)
        e = info.value
        details.append(_collect(messages, e.status, e.id, e.part, e.message, e.detail))
    connection, exchange, replies = await osm_client(bus.url)
    try:
        await osm_wire_ready(connection)
        for body in [*(json.dumps(b).encode() for b in BAD_QUEUEMASTER_REQUESTS), b"{nope", b"[1, 2"]:
            answer = await ask(exchange, replies, body)
            details.append(
                _collect(
                    messages,
                    answer["status"],
                    answer["error"],
                    "toposm.queuemaster (osm)",
                    answer["message"],
                    answer.get("detail"),
                )
            )
    finally:
        await connection.close()
    varied = {triple: texts for triple, texts in messages.items() if len(texts) > 1}
    assert not varied, varied
    assert len(messages) >= 5  # several kinds of error, each with many requests behind it
    assert len({d for d in details if d}) >= len(BAD_QUEUEMASTER_REQUESTS)  # the specifics are in detail


def test_every_error_id_the_services_raise_has_its_message():
    """`failed(id)`/`errored(id)` read the one table: an id missing there would crash the handler."""
    used = set()
    for path in Path("services").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("failed", "errored")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                used.add(node.args[0].value)
    assert used and used <= set(MESSAGES), used - set(MESSAGES)
