"""Calls between qbroker and the original QBroker (trio_qbroker, its own code and venv), both ways."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qbroker import NoServer, RequestError, RequestFailed
from tests.conftest import MakeUnit
from tests.qbroker.interop.conftest import StartOriginal


async def serving_unit(qbroker_units: MakeUnit, app: str = "qb.server") -> Any:
    unit = await qbroker_units(app)

    @unit.rpc("qb.echo")
    async def echo(body: Any = None) -> Any:
        return body

    @unit.rpc("qb.fail")
    async def fail(body: Any = None) -> Any:
        raise ValueError(f"qbroker says no to {body}")

    @unit.rpc("qb.strict")
    async def strict(n: int) -> int:
        return n + 1

    await unit.start()
    return unit


async def test_original_client_calls_qbroker(qbroker_units: MakeUnit, original: StartOriginal) -> None:
    await serving_unit(qbroker_units)
    # Its own dead-letter collector off: the answer to a name nobody serves is qbroker's.
    client = await original("orig.client", serve=False, dead=False)
    assert await client.rpc("qb.echo", "hello") == {"ok": "hello", "id": 1}  # text/plain both ways
    answer = await client.rpc("qb.echo", {"a": [1, {"b": None}], "s": "ü"})  # application/json+obj
    assert answer["ok"] == {"a": [1, {"b": None}], "s": "ü"}
    assert (await client.rpc("qb.echo"))["ok"] is None  # a request without a body, and a reply without one
    # A qbroker handler's ValueError is the original caller's ValueError.
    answer = await client.rpc("qb.fail", 7)
    assert answer["error"] == {"type": "ValueError", "str": "qbroker says no to 7"}
    # qbroker's own errors: the original's generic remote error, with what was wrong.
    answer = await client.rpc("qb.strict", {"n": "many"})
    assert answer["error"]["type"] == "MsgError" and "invalid parameters for qb.strict" in answer["error"]["str"]
    # Nobody serves it: qbroker's dead-letter collector answers as the original's own would.
    answer = await client.rpc("nobody.serves.this")
    assert answer["error"] == {"type": "DeadLettered", "str": "Dead: queue=rpc route=nobody.serves.this"}
    assert client.alive


async def test_qbroker_calls_original_server(qbroker_units: MakeUnit, original: StartOriginal) -> None:
    client = await qbroker_units("qb.client")
    await client.start()
    server = await original("orig.server")  # with its own dead-letter collector, as it runs by default
    assert await client.call("orig.echo", "text") == "text"  # text/plain
    body = {"x": [1, {"y": None}], "z": "ü"}
    assert await client.call("orig.echo", body) == body  # application/json+obj, read as JSON
    assert await client.call("orig.echo") is None  # no body: null both ways
    assert await client.call("orig.bytes") == b"\x00\xffraw"  # application/binary, read as bytes
    # Its handler raised: with debug the original answers with its own error element...
    with pytest.raises(ValueError, match="bad value: 1") as raised:
        await client.call("orig.fail", 1, debug=True)
    assert isinstance(raised.value, RequestError) and raised.value.id == "python.ValueError"
    # ... without, it rejects the request, and the dead-letter answers (qbroker's and its own) say so.
    with pytest.raises(RequestFailed) as refused:
        await client.call("orig.fail", 2)
    assert refused.value.id in ("rejected", "no_server")
    assert server.alive and await client.call("orig.echo", "still there") == "still there"


@pytest.mark.parametrize("qbroker_collects", [False, True], ids=["its_collector_alone", "both_collectors"])
async def test_a_name_nobody_serves_is_no_server_whoever_answers_first(
    qbroker_units: MakeUnit, original: StartOriginal, qbroker_collects: bool
) -> None:
    """The original's dead-letter answer (DeadLettered) reads as qbroker's no_server; with both collectors on
    the bus, whichever answers first, every call ends no_server."""
    client = await qbroker_units("qb.client", dead_letters=qbroker_collects)
    await client.start()
    await original("orig.collector", serve=False, dead=True)
    results = await asyncio.gather(
        *(client.call("nobody.at.all", n, timeout=10) for n in range(8)), return_exceptions=True
    )
    assert all(isinstance(r, NoServer) for r in results), results
