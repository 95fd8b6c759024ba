"""The process runner: start order, graceful stop on the first signal, kill on the second, always closed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from qbroker import RequestContext, Unit
from qbroker.runner import run_service
from tests.conftest import MakeUnit
from tests.qbroker.core.waits import HANG

ROOT = Path(__file__).resolve().parents[3]


class Recorder:
    """A service that records the unit's state at each step."""

    def __init__(self, unit: Unit, *, fail_start: bool = False) -> None:
        self.unit = unit
        self.fail_start = fail_start
        self.steps: list[tuple[str, str]] = []
        self.started = asyncio.Event()

    async def start(self) -> None:
        self.steps.append(("start", self.unit.state))
        if self.fail_start:
            raise RuntimeError("service could not start")
        self.started.set()

    async def stop(self) -> None:
        self.steps.append(("stop", self.unit.state))


async def test_run_service_starts_unit_then_service_and_stops_in_reverse(make_unit: MakeUnit) -> None:
    unit = await make_unit("test.runner")

    @unit.rpc("t.runner.echo")
    async def echo(text: str) -> str:
        return text

    service = Recorder(unit)
    stop = asyncio.Event()
    running = asyncio.create_task(run_service(unit, service, stop=stop, drain_timeout=HANG))
    await asyncio.wait_for(service.started.wait(), HANG)
    client = await make_unit("test.client")
    await client.start()
    assert await client.call("t.runner.echo", {"text": "hi"}, timeout=HANG) == "hi"  # endpoints consume
    stop.set()
    await asyncio.wait_for(running, HANG)
    # The service starts on a started unit and stops while the unit still runs (before the drain).
    assert service.steps == [("start", "started"), ("stop", "started")]
    assert unit.state == "stopped"


async def test_run_service_closes_the_unit_when_the_service_fails_to_start(make_unit: MakeUnit) -> None:
    unit = await make_unit("test.runner")
    service = Recorder(unit, fail_start=True)
    with pytest.raises(RuntimeError, match="could not start"):
        await asyncio.wait_for(run_service(unit, service), HANG)
    assert unit.state == "stopped"


async def _spawn(amqp_url: str, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.qbroker.core.serve_example",
        cwd=ROOT,
        env=dict(os.environ, QBROKER_URL=amqp_url, **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), HANG)).decode().strip()


@pytest.mark.rabbitmq_only
async def test_serve_stops_gracefully_on_sigterm(make_unit: MakeUnit, amqp_url: str) -> None:
    proc = await _spawn(amqp_url)
    try:
        assert await _line(proc) == "start unit=started"
        client = await make_unit("test.client")
        await client.start()
        assert await client.call("t.serve.where", timeout=HANG) == "started"
        # What start-up made is out of the collector's scans (freeze_startup_heap).
        assert await client.call("t.serve.frozen", timeout=HANG) > 10_000
        proc.send_signal(signal.SIGTERM)
        assert await _line(proc) == "stop unit=started"
        assert await _line(proc) == "exited gracefully"
        assert await asyncio.wait_for(proc.wait(), HANG) == 0
    finally:
        if proc.returncode is None:
            proc.kill()


@pytest.mark.rabbitmq_only
async def test_serve_kills_on_a_second_signal(make_unit: MakeUnit, amqp_url: str) -> None:
    proc = await _spawn(amqp_url, HANG_ON_STOP="1")
    try:
        assert await _line(proc) == "start unit=started"
        proc.send_signal(signal.SIGINT)
        assert await _line(proc) == "stop unit=started"  # and the service's stop() never returns
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), HANG) == 1
    finally:
        if proc.returncode is None:
            proc.kill()


async def test_a_stop_abandons_the_handlers_still_running_when_its_drain_times_out(make_unit: MakeUnit) -> None:
    """Handlers that keep working past the drain timeout are cancelled then, all at once, before anything
    else of the stop: no handler takes another step once the drain has timed out (with 100,000 of them,
    those steps were 46 s of the close competing with them, docs/performance.md)."""
    unit = await make_unit("test.drain")
    n = 200
    started, cancelled, steps_after_drain = 0, 0, 0
    all_started = asyncio.Event()
    logs: list[dict[str, Any]] = []

    def drain_over() -> bool:
        return any(entry["event"].startswith("drain timed out") for entry in logs)

    @unit.rpc("t.drain.busy")
    async def busy(ctx: RequestContext) -> None:
        nonlocal started, cancelled, steps_after_drain
        await ctx.detach()
        started += 1
        if started == n:
            all_started.set()
        try:
            while True:  # working on, one short step after another (not stuck: the loop keeps turning)
                await asyncio.sleep(0.001)
                steps_after_drain += drain_over()
        except asyncio.CancelledError:
            cancelled += 1
            raise

    await unit.start()
    client = await make_unit("test.client")
    await client.start()
    for _ in range(n):
        await client.cast("t.drain.busy")
    await asyncio.wait_for(all_started.wait(), HANG)
    with structlog.testing.capture_logs() as captured:
        logs = captured
        await unit.stop(drain_timeout=0.2)
    assert drain_over() and unit.state == "stopped"
    assert steps_after_drain == 0
    assert cancelled == n
    [abandoned] = [entry for entry in logs if entry["event"] == "handlers abandoned"]
    assert abandoned["count"] == n
