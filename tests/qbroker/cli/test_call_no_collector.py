"""``qbroker call`` says when nobody collects dead letters, instead of a bare timeout."""

from __future__ import annotations

import uuid

from tests.qbroker.cli.helpers import run_cli


async def test_call_timeout_names_the_missing_dead_letter_collector(amqp_url: str, make_unit: object) -> None:
    prefix = f"nocollector-{uuid.uuid4().hex[:8]}."
    # Declares the prefixed exchanges and `dead` queue, but collects nothing (like a bus without one).
    unit = await make_unit("clitest.quiet", exchange_prefix=prefix, dead_letters=False)  # type: ignore[operator]
    await unit.start()
    result = await run_cli(amqp_url, "call", "clitest.nobody", "--timeout", "0.5", QBROKER_EXCHANGE_PREFIX=prefix)
    assert result.code == 3, result  # timeout
    assert "nobody on the bus collects dead letters" in result.stderr
    assert "qbroker-dead-letter" in result.stderr
