"""The standalone collector (`qbroker-dead-letter`) answers dead requests and pings, and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness import eventually
from qbroker import Config, NoServer, Unit

pytestmark = pytest.mark.rabbitmq_only


async def test_standalone_collector_answers_for_units_that_do_not_collect(amqp_url: str) -> None:
    env = dict(os.environ, QBROKER_URL=amqp_url, QBROKER_EXCHANGE_PREFIX="standalone.")
    collector = subprocess.Popen([sys.executable, "-m", "qbroker.cli.dead_letter"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client = Unit("test.client", config=Config(url=amqp_url, exchange_prefix="standalone.", dead_letters=False))
    await client.start()
    try:
        async def collector_answers() -> bool:
            async for reply in client.gather("qbroker.ping", {}, timeout=1):
                if reply.body["app"] == "qbroker.dead_letter":
                    return True
            return False

        await eventually(collector_answers, interval=0.2)  # the standalone collector answers qbroker.ping
        # The collector's answer, not the caller's own deadline (that would be CallTimeout).
        with pytest.raises(NoServer, match="no server for t.absent"):
            await client.call("t.absent", {}, timeout=30)
        counts = {}
        async for reply in client.gather("qbroker.ping", {}, timeout=2, gap=0.5):
            if reply.body["app"] == "qbroker.dead_letter":
                counts = reply.body["dead_letters"]
        assert counts.get("rpc.unroutable", 0) >= 1
    finally:
        await client.stop()
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(20) == 0
