"""qbroker starting on a vhost where the original QBroker declared the exchanges first (its ``dead`` is a topic
exchange, its ``alert`` has no alternate exchange)."""

from __future__ import annotations

from tests.conftest import MakeUnit
from tests.qbroker.interop.conftest import StartOriginal


async def test_qbroker_starting_after_the_original(original: StartOriginal, qbroker_units: MakeUnit) -> None:
    orig = await original("orig.first")  # the first on a fresh vhost: the exchanges are its own
    unit = await qbroker_units("qb.second")
    await unit.start()
    assert await unit.call("orig.echo", "after", timeout=10) == "after"
    assert (await orig.rpc("qbroker.ping", uuid=unit.uuid))["ok"]["uuid"] == unit.uuid
