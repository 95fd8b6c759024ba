"""The demo's parts that need no whole run (tests/test_demo.py runs one): ``bin/demo --help`` answers before any
set-up, as ``bin/demo``; the watch on its services says at once which one ended, how, and what still runs."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import qbroker
from demo.processes import Service, how_it_ended, watch
from harness import HANG

ROOT = Path(__file__).resolve().parents[1]


def bare_checkout(tmp_path: Path) -> Path:
    """bin/demo with nothing else there to run: no .venv, no bin/bootstrap, no broker set-up."""
    for relative in ("bin/demo", "demo/__init__.py", "demo/arguments.py", "qbroker/__init__.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, tmp_path / relative)
    return tmp_path


def run_bin_demo(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    python = shutil.which("python3") or sys.executable  # the system's, as before bin/bootstrap
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHON": python}
    return subprocess.run(
        [str(checkout / "bin" / "demo"), *args], capture_output=True, text=True, env=env, timeout=HANG
    )


def test_help_and_version_answer_before_any_set_up(tmp_path: Path) -> None:
    checkout = bare_checkout(tmp_path)
    for flag in ("--help", "-h"):
        done = run_bin_demo(checkout, flag)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("usage: bin/demo ") and "--keep-running" in done.stdout
        assert "__main__" not in done.stdout
    done = run_bin_demo(checkout, "--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"bin/demo (qbroker {qbroker.__version__})")
    done = run_bin_demo(checkout, "--keep-runing")  # a typo: refused at once, not after minutes of set-up
    assert done.returncode == 2 and "bin/demo: error: unrecognized arguments: --keep-runing" in done.stderr
    assert not (checkout / ".venv").exists() and not (checkout / "var").exists()


def test_the_demo_parses_with_the_same_parser() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=HANG
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: bin/demo ")
    assert done.stdout == run_bin_demo(ROOT, "--help").stdout


async def test_a_service_that_ends_is_reported_at_once_with_what_still_runs(tmp_path: Path) -> None:
    sleepers = [Service(subprocess.Popen(["sleep", "600"]), tmp_path / f"service-{i}.log") for i in range(2)]
    said: list[str] = []
    heard = asyncio.Event()

    def say(text: str) -> None:
        said.append(text)
        heard.set()

    watching = asyncio.ensure_future(watch(sleepers, say))
    try:
        first, second = sleepers
        first.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(heard.wait(), HANG)
        while len(said) < 2:
            heard.clear()
            await asyncio.wait_for(heard.wait(), HANG)
        assert said == [
            f"  ! sleep (pid {first.pid}) killed by SIGTERM; its log: {first.log}",
            f"  ! still running: sleep (pid {second.pid})",
        ]
        second.process.kill()
        await asyncio.wait_for(watching, HANG)  # none runs any more: the watch ends
        assert said[-1] == "  ! still running: none of the services"
    finally:
        watching.cancel()
        for sleeper in sleepers:
            sleeper.process.kill()
            sleeper.process.wait()


def test_how_a_process_ended() -> None:
    assert how_it_ended(0) == "exited with status 0"
    assert how_it_ended(3) == "exited with status 3"
    assert how_it_ended(-signal.SIGKILL) == "killed by SIGKILL"
