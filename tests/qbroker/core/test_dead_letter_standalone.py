"""The standalone collector (`qbroker-dead-letter`) answers dead requests and pings, and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness import eventually
from harness.private_node import free_port
from qbroker import Config, NoServer, Unit
from tests.prometheus_text import created_series, says_its_version, scrape, value

pytestmark = pytest.mark.rabbitmq_only


async def test_standalone_collector_answers_for_units_that_do_not_collect(amqp_url: str) -> None:
    env = dict(os.environ, QBROKER_URL=amqp_url, QBROKER_EXCHANGE_PREFIX="standalone.")
    collector = subprocess.Popen(
        [sys.executable, "-m", "qbroker.cli.dead_letter"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
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


async def test_standalone_collector_listens_where_it_is_told(amqp_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`--hear NAME`: the library's own program listens where a deployment's running programs all listen
    (TopOSM's `toposm`), knowing nothing of the application: heard, logged and counted, never answered."""
    env = dict(os.environ, QBROKER_URL=amqp_url, QBROKER_EXCHANGE_PREFIX="hears.")
    log = tmp_path / "collector.log"
    with open(log, "wb") as out:
        collector = subprocess.Popen(
            [sys.executable, "-m", "qbroker.cli.dead_letter", "--hear", "toposm"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = Unit("test.client", config=Config(url=amqp_url, exchange_prefix="hears.", dead_letters=False))
    await client.start()
    try:

        async def listening() -> bool:
            async for reply in client.gather("qbroker.ping", {}, timeout=1):
                if reply.body["app"] == "qbroker.dead_letter":
                    return "toposm" in reply.body["listeners"]
            return False

        await eventually(listening, interval=0.2)
        replies = [r async for r in client.gather("toposm", {"command": "queuemaster online"}, timeout=1)]
        assert replies == []  # nothing answered
        await eventually(lambda: "alert heard" in log.read_text())
    finally:
        await client.stop()
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(20) == 0
    assert "'toposm': 1" in log.read_text()  # the count, logged at stop


async def test_standalone_collector_serves_its_metrics(amqp_url: str) -> None:
    """`--metrics-port`: the library's figures of the collector's unit (dead letters answered and taken,
    its connection), its build info with the installed version, and no `_created` series."""
    env = dict(os.environ, QBROKER_URL=amqp_url, QBROKER_EXCHANGE_PREFIX="measured.")
    port = free_port()
    collector = subprocess.Popen(
        [sys.executable, "-m", "qbroker.cli.dead_letter", "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    client = Unit("test.client", config=Config(url=amqp_url, exchange_prefix="measured.", dead_letters=False))
    await client.start()
    try:

        def serving() -> str | None:
            assert collector.poll() is None, collector.communicate()[0].decode()
            try:
                text = scrape(port)
            except OSError:
                return None
            return text if value(text, "qbroker_connections") == 1 else None

        await eventually(serving, interval=0.2)
        with pytest.raises(NoServer):
            await client.call("t.absent", {}, timeout=30)

        def counted() -> str | None:
            text = scrape(port)
            return text if value(text, 'qbroker_dead_letters_answered_total{reason="unroutable"}') == 1 else None

        text = await eventually(counted)
        assert value(text, 'qbroker_dead_letters_total{kind="rpc",reason="unroutable"}') == 1
        assert says_its_version(text, "qbroker_dead_letter"), text
        assert not created_series(text)
    finally:
        await client.stop()
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(20) == 0
