"""``QBROKER_LOG_FORMAT=json``: every log line is one JSON object, and every line logged while handling a
request carries that request's correlation id, even from a plain module logger."""

from __future__ import annotations

import asyncio
import json
import sys

SCRIPT = """
import asyncio, sys
import structlog
from qbroker import Config, Unit
from qbroker.log import configure_logging

log = structlog.get_logger("test.json")

async def main(url):
    configure_logging()
    server = Unit("test.json.server", config=Config(url=url))

    @server.rpc("test.json.work")
    async def work(n: int) -> int:
        log.info("first line", n=n)
        await asyncio.sleep(0)
        log.warning("second line", n=n)
        return n

    client = Unit("test.json.client", config=Config(url=url))
    await server.start()
    await client.start()
    await asyncio.gather(*(client.call("test.json.work", {"n": n}) for n in range(3)))
    await client.stop()
    await server.stop()

asyncio.run(main(sys.argv[1]))
"""


async def test_json_lines_with_correlation_ids(amqp_url: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT,
        amqp_url,
        env={"QBROKER_LOG_FORMAT": "json", "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = [json.loads(line) for line in err.decode().splitlines() if line.strip()]  # all JSON
    handler_lines = [line for line in lines if line["event"] in ("first line", "second line")]
    assert len(handler_lines) == 6
    ids: dict[int, set[str]] = {}
    for line in handler_lines:
        ids.setdefault(line["n"], set()).add(line["correlation_id"])
    assert all(len(v) == 1 for v in ids.values())  # both lines of one request: the same id
    assert len({next(iter(v)) for v in ids.values()}) == 3  # three requests: three ids
    assert all("correlation_id" not in line for line in lines if line["event"] == "unit started")
