"""A unit whose log pipe closes, or stalls, keeps acking and answering, and stops on SIGTERM.

The standalone dead-letter collector is the issue's case: it logs every dead request it answers, so once
the reader of its stderr is gone every message it handles meets a failing log write. Before the fix the
write's BrokenPipeError escaped between the reply and the ack (256 requests held unacked for good) and the
SIGTERM handler died in its own "stopping" log line. A reader that stays but stops reading (a stalled log
collector) filled the pipe's 64 KB and then blocked every log write, and the event loop with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid

import aio_pika
import pytest

from harness import HANG, eventually
from qbroker import Config, NoServer, Unit

pytestmark = pytest.mark.rabbitmq_only

BURST = 600  # more than the collector's prefetch (256): held requests would stall the burst
DRAIN_TIMEOUT = 5.0


async def _collector_ping(client: Unit) -> dict | None:
    async for reply in client.gather("qbroker.ping", {}, timeout=1):
        if isinstance(reply.body, dict) and reply.body.get("app") == "qbroker.dead_letter":
            return reply.body
    return None


@pytest.mark.parametrize("reader", ["closed", "stalled"])
async def test_collector_with_a_dead_log_pipe_answers_acks_and_stops(amqp_url: str, reader: str) -> None:
    prefix = f"logpipe{uuid.uuid4().hex[:6]}."
    env = dict(
        os.environ,
        QBROKER_URL=amqp_url,
        QBROKER_EXCHANGE_PREFIX=prefix,
        QBROKER_LOG_LEVEL="DEBUG",
        QBROKER_DRAIN_TIMEOUT=str(DRAIN_TIMEOUT),
    )
    collector = subprocess.Popen(
        [sys.executable, "-m", "qbroker.cli.dead_letter"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    config = Config(url=amqp_url, exchange_prefix=prefix, dead_letters=False)
    client = Unit("test.client", config=config)
    try:
        assert collector.stdout is not None
        # The collector is up once it says so; then its log reader goes away, like `... | head -1`.
        for line in collector.stdout:
            if b"collecting dead letters" in line:
                break
        if reader == "closed":
            collector.stdout.close()
        await client.start()
        await eventually(lambda: _collector_ping(client), timeout=HANG)

        async def one(i: int) -> BaseException | None:
            try:
                await client.call(f"t.absent.{i}", {}, timeout=HANG)
            except BaseException as exc:  # noqa: BLE001 - the answer is checked below
                return exc
            return None

        answers = await asyncio.gather(*(one(i) for i in range(BURST)))
        assert all(isinstance(a, NoServer) for a in answers), {type(a).__name__ for a in answers}
        info = await _collector_ping(client)
        assert info is not None and info["dead_letters"]["rpc.unroutable"] == BURST
        if reader == "closed":
            assert info.get("log_lines_dropped", 0) >= BURST  # one line per answered request, each counted
    finally:
        await client.stop()
        collector.send_signal(signal.SIGTERM)
        try:
            code = collector.wait(DRAIN_TIMEOUT + HANG)
        except subprocess.TimeoutExpired:
            collector.kill()
            code = collector.wait()
        if collector.stdout is not None:
            collector.stdout.close()
    assert code == 0, "the collector ignored SIGTERM or died"
    # Every request was acked: none went back to the dead queue when the collector's channel closed
    # (what is there are the stop announcements nobody listened to).
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        dead = await channel.declare_queue(config.dead_queue_name, passive=True)
        left: list[str] = []
        while (message := await dead.get(no_ack=True, fail=False)) is not None:
            left.append(message.routing_key or "")
        assert not [key for key in left if key.startswith("t.absent.")], left
