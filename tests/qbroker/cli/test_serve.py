"""``qbroker serve MODULE:NAME`` runs a service from a user's module (a class, a factory or a Unit) with the
runner's signals and drain: called with ``qbroker call``, SIGTERMed with a call in hand, it answers that call
and exits 0. A module or name that does not exist is one line, exit 64."""

from __future__ import annotations

import asyncio
import signal
import textwrap
from pathlib import Path

import pytest

from harness import HANG
from tests.qbroker.cli.helpers import QBROKER, cli_env, run_cli

MODULE = """
import asyncio
from pathlib import Path

from qbroker import Unit

HERE = Path(__file__).parent


class Service:
    def __init__(self, unit: Unit) -> None:
        unit.rpc("served.echo")(self.echo)
        unit.rpc("served.slow")(self.slow)

    async def echo(self, text: str) -> str:
        return text

    async def slow(self) -> str:
        (HERE / "slow-started").touch()  # the test SIGTERMs the server now
        while not (HERE / "release").exists():
            await asyncio.sleep(0.02)
        return "finished"

    async def stop(self) -> None:  # start() is left out: optional
        (HERE / "stopped").touch()


def make_service(unit: Unit) -> None:  # a factory that only registers endpoints
    unit.rpc("served.echo")(Service.echo.__get__(object()))


unit = Unit("served.unit")  # a Unit the module builds itself


@unit.rpc("served.echo")
async def echo(text: str) -> str:
    return text
"""


async def _wait_for(path: Path, proc: asyncio.subprocess.Process) -> None:
    async with asyncio.timeout(HANG):
        while not path.exists():
            assert proc.returncode is None, "the server exited"
            await asyncio.sleep(0.02)


async def _start(tmp_path: Path, amqp_url: str, spec: str, *args: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        QBROKER,
        "serve",
        spec,
        *args,
        cwd=tmp_path,
        env=cli_env(amqp_url, QBROKER_DRAIN_TIMEOUT="30"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    async with asyncio.timeout(HANG):
        async for line in proc.stderr:
            if b"unit started" in line:
                return proc
    raise AssertionError(f"qbroker serve {spec} ended before its unit started (exit {await proc.wait()})")


async def test_serve_a_service_class_call_it_and_sigterm_drains(amqp_url: str, tmp_path: Path) -> None:
    (tmp_path / "served_app.py").write_text(textwrap.dedent(MODULE))
    proc = await _start(tmp_path, amqp_url, "served_app:Service", "--app", "served.app")
    try:
        echoed = await run_cli(amqp_url, "call", "served.echo", "text=hi")
        assert (echoed.code, echoed.stdout.strip()) == (0, '"hi"'), echoed.stderr
        units = await run_cli(amqp_url, "list", "--json", "--timeout", "1")
        assert "served.app" in {u["app"] for u in units.json()}
        in_hand = asyncio.create_task(run_cli(amqp_url, "call", "served.slow", "--timeout", "60"))
        await _wait_for(tmp_path / "slow-started", proc)
        proc.send_signal(signal.SIGTERM)
        await _wait_for(tmp_path / "stopped", proc)  # the service's stop(): the drain has begun
        (tmp_path / "release").touch()
        slow = await asyncio.wait_for(in_hand, HANG)
        assert (slow.code, slow.stdout.strip()) == (0, '"finished"'), slow.stderr  # answered while draining
        assert await asyncio.wait_for(proc.wait(), HANG) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("spec", ["served_app:make_service", "served_app:unit"])
async def test_serve_a_factory_or_a_unit(amqp_url: str, tmp_path: Path, spec: str) -> None:
    (tmp_path / "served_app.py").write_text(textwrap.dedent(MODULE))
    proc = await _start(tmp_path, amqp_url, spec)
    try:
        echoed = await run_cli(amqp_url, "call", "served.echo", "text=hi")
        assert (echoed.code, echoed.stdout.strip()) == (0, '"hi"'), echoed.stderr
        units = await run_cli(amqp_url, "list", "--json", "--timeout", "1")
        # a factory's unit is named after its module (no --app); a Unit keeps its own name
        assert ("served.unit" if spec.endswith(":unit") else "served_app") in {u["app"] for u in units.json()}
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), HANG) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("no_such_module_here:Service",), "qbroker: usage: no module named 'no_such_module_here'"),
        (
            ("tests.qbroker.cli.helpers:NoSuchThing",),
            "qbroker: usage: module 'tests.qbroker.cli.helpers' has no attribute 'NoSuchThing'",
        ),
        (
            ("tests.qbroker.cli.helpers:QBROKER",),
            "qbroker: usage: tests.qbroker.cli.helpers:QBROKER is a str: expected a Unit",
        ),
        (("tests.qbroker.cli.helpers",), "qbroker: usage: 'tests.qbroker.cli.helpers': expected MODULE:NAME"),
    ],
)
async def test_a_bad_name_is_one_line_exit_64(amqp_url: str, args: tuple[str, ...], says: str) -> None:
    result = await run_cli(amqp_url, "serve", *args)
    assert result.code == 64
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), result.stderr
