"""``qbroker dead``: the QBroker seed's "dead keeps" copies, listed, shown and replayed by an operator;
bounded by count (and age: the queue's x-message-ttl)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
import pytest

from harness import HANG, eventually
from qbroker import NoServer, RequestError
from tests.qbroker.cli.helpers import run_cli


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stdout.splitlines() if line.strip()]


async def test_dead_requests_are_kept_listed_shown_and_replayed(amqp_url: str, make_unit: Any) -> None:
    prefix = f"kept-{uuid.uuid4().hex[:8]}."
    env = {"QBROKER_EXCHANGE_PREFIX": prefix, "QBROKER_DEAD_KEPT_MAX": "3"}
    client = await make_unit("clitest.client", exchange_prefix=prefix, dead_kept_max=3)
    await client.start()
    for i in range(5):  # nobody serves it: the collector answers no_server and acks its copy in `dead`
        with pytest.raises(NoServer):
            await client.call("clitest.later", {"n": i}, timeout=10)

    listed = await run_cli(amqp_url, "dead", "list", **env)
    assert listed.code == 0, listed
    kept = _lines(listed.stdout)
    # bounded by count: the three newest, oldest first
    assert [(k["kind"], k["reason"], k["name"]) for k in kept] == [("rpc", "unroutable", "clitest.later")] * 3
    again = await run_cli(amqp_url, "dead", "list", **env)
    assert _lines(again.stdout) == kept  # listing consumed nothing

    shown = await run_cli(amqp_url, "dead", "show", kept[0]["message_id"], **env)
    assert shown.code == 0, shown
    assert orjson.loads(orjson.loads(shown.stdout)["body"]) == {"n": 2}  # the request as it was sent

    served: list[Any] = []
    server = await make_unit("clitest.server", exchange_prefix=prefix, dead_kept_max=3)

    @server.rpc("clitest.later")
    async def later(n: int) -> int:
        served.append(n)
        return n

    await server.start()
    replayed = await run_cli(amqp_url, "dead", "replay", kept[0]["message_id"], "3", **env)
    assert replayed.code == 0, replayed
    assert [r["name"] for r in _lines(replayed.stdout)] == ["clitest.later", "clitest.later"]
    async with asyncio.timeout(HANG):
        while sorted(served) != [2, 4]:
            await asyncio.sleep(0.05)
    left = _lines((await run_cli(amqp_url, "dead", "list", **env)).stdout)
    assert [k["message_id"] for k in left] == [kept[1]["message_id"]]
    missing = await run_cli(amqp_url, "dead", "show", "no-such-id", **env)
    assert missing.code == 2 and "no kept dead message" in missing.stderr


async def test_a_request_out_of_retries_is_kept_as_such(amqp_url: str, make_unit: Any) -> None:
    """The seed: exhausted retries leave a copy in dead; the copy is kept, named for what it is."""
    prefix = f"kept-{uuid.uuid4().hex[:8]}."
    server = await make_unit("clitest.flaky", exchange_prefix=prefix)

    @server.rpc("clitest.flaky", retries=1, retry_delay=0.05)
    async def flaky() -> None:
        raise RequestError("disk_full", "no space left")

    await server.start()
    with pytest.raises(RequestError):
        await server.call("clitest.flaky", {}, timeout=10)

    async def kept() -> list[dict[str, Any]]:
        return _lines((await run_cli(amqp_url, "dead", "list", QBROKER_EXCHANGE_PREFIX=prefix)).stdout)

    async with asyncio.timeout(HANG):  # the copy is made as the collector takes it from `dead`
        while not (found := await kept()):
            await asyncio.sleep(0.1)
    assert [(k["kind"], k["reason"], k["name"]) for k in found] == [("rpc", "retries_exhausted", "clitest.flaky")]


async def test_kept_copies_are_bounded_in_bytes(amqp_url: str, make_unit: Any) -> None:
    """Every account may publish into ``dead.kept.in`` and any request may be 16 MiB: bounded by count alone,
    10,000 copies could park 160 GB on the broker for a week (its disk alarm then blocks every publisher).
    ``x-max-length-bytes`` drops the oldest copies past ``dead_kept_max_bytes``, whatever the count."""
    from qbroker import Config
    from qbroker.dead_kept import KeptReader

    prefix = f"kept-{uuid.uuid4().hex[:8]}."
    budget = 1 << 20  # 1 MiB
    attacker = await make_unit("clitest.attacker", exchange_prefix=prefix, dead_kept_max_bytes=budget)
    await attacker.start()
    for i in range(6):  # 6 x 300 KB, nobody serves the name: each request dies and is kept
        with pytest.raises(NoServer):
            await attacker.call("clitest.nobody", {"n": i, "pad": "x" * 300_000}, timeout=HANG)
    collector = attacker.dead_letters
    assert collector is not None
    await eventually(lambda: collector.counts["kept"] + collector.counts["kept_failed"] >= 6)
    assert collector.counts["kept_failed"] == 0

    connection = attacker.bus.connection
    assert connection is not None
    reader = KeptReader(connection, Config(url=amqp_url, exchange_prefix=prefix))
    try:
        kept = await reader.read(100)
    finally:
        await reader.close()
    assert sum(k.size for k in kept) <= budget, [k.size for k in kept]
    assert [orjson.loads(k.body)["n"] for k in kept] == [3, 4, 5]  # the newest, oldest first
