"""``qbroker schedule``: a scheduler process, and schedules added, listed and removed from the shell."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from typing import Any

from harness import HANG, eventually
from qbroker import Config, Unit
from tests.qbroker.cli.helpers import QBROKER, cli_env, run_cli


async def test_schedule_add_list_remove_with_a_scheduler_process(amqp_url: str) -> None:
    prefix = f"clisch{uuid.uuid4().hex[:8]}."
    env = {"QBROKER_EXCHANGE_PREFIX": prefix}
    ticks: asyncio.Queue[int] = asyncio.Queue()
    server = Unit("test.ticks", config=Config(url=amqp_url, exchange_prefix=prefix))

    @server.rpc("test.tick")
    async def tick(n: int) -> None:
        await ticks.put(n)

    scheduler = await asyncio.create_subprocess_exec(
        QBROKER,
        "schedule",
        "serve",
        env=cli_env(amqp_url, **env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with server:
            usage = await run_cli(
                amqp_url, "schedule", "add", "test.tick", "n=4", "--every", "1", "--cron", "* * * * *", **env
            )
            assert usage.code == 64 and "exactly one of every or cron" in usage.stderr

            added = await run_cli(amqp_url, "schedule", "add", "test.tick", "n=4", "--every", "0.2", **env)
            assert added.code == 0, added.stderr
            schedule_id = added.stdout.strip()
            assert len(schedule_id) == 16
            assert await asyncio.wait_for(ticks.get(), HANG) == 4  # sent by the scheduler process

            async def listed_json() -> Any:
                listed = (await run_cli(amqp_url, "schedule", "list", "--json", **env)).json()
                return listed if listed["schedules"] else None

            listed = await eventually(listed_json, HANG, 0.2)
            assert [s["id"] for s in listed["schedules"]] == [schedule_id]
            table = await run_cli(amqp_url, "schedule", "list", **env)
            assert f"{schedule_id}  cast  test.tick  every 0.2s" in table.stdout

            assert (await run_cli(amqp_url, "schedule", "remove", schedule_id, **env)).code == 0

            async def removed() -> bool:
                return (await run_cli(amqp_url, "schedule", "list", **env)).stdout.strip() == "no schedules"

            await eventually(removed, HANG, 0.2)
    finally:
        if scheduler.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it may have exited on its own (a failure)
                scheduler.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(scheduler.communicate(), HANG)
    assert scheduler.returncode == 0, err.decode()[-2000:]
