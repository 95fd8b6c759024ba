"""docs/tutorial.md, run as a reader would: its files written, its services started, its commands run
against real RabbitMQ, and their output compared with what the page shows."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import HANG

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# The install step is what the packaging test runs (tests/test_packaging.py, on the built wheels); here the
# checkout is used.
INSTALL = ("python -m venv", "pip install", "export ")


def blocks() -> list[tuple[str, str]]:
    return [(lang, text) for lang, text in BLOCK.findall(TUTORIAL.read_text())]


def commands() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) of every console block, in page order."""
    out: list[tuple[str, list[str]]] = []
    for lang, text in blocks():
        if lang != "console":
            continue
        for line in text.splitlines():
            if line.startswith("$ "):
                out.append((line[2:].split("  #")[0].strip(), []))
            elif out:
                out[-1][1].append(line)
    return out


def test_every_python_block_is_a_named_file() -> None:
    for lang, text in blocks():
        if lang == "python":
            assert re.match(r"# \w+\.py\n", text), f"a python block without '# name.py' first: {text[:60]!r}"


def install_commands() -> list[str]:
    """The page's install step, as written (``pip install ...``)."""
    return [command for command, _ in commands() if command.startswith("pip install")]


def test_the_tutorial_works(amqp_url: str, tmp_path: Path) -> None:
    run_tutorial(tmp_path, amqp_url, Path(sys.executable).parent, pythonpath=ROOT)


def run_tutorial(workdir: Path, amqp_url: str, bin_dir: Path, pythonpath: Path | None = None) -> None:
    """Every block of the page in ``workdir``, with ``bin_dir``'s ``python`` and ``qbroker`` (a venv's) first
    on PATH; ``pythonpath``: where qbroker is imported from when it is not installed there."""
    for lang, text in blocks():
        if lang == "python":
            name = text.splitlines()[0][2:].strip()
            (workdir / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_") and k != "PYTHONPATH"}
    env.update(QBROKER_URL=amqp_url, COLUMNS="200", NO_COLOR="1", PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    services: list[subprocess.Popen[str]] = []
    ran = 0
    try:
        for command, shown in commands():
            if command.startswith(INSTALL):
                continue
            if not shown and command.startswith("qbroker serve "):
                services.append(start_service(command, workdir, env))
                continue
            done = subprocess.run(
                command, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=HANG
            )
            # What the page shows: the output, or, of a command that failed, what it said on stderr.
            said = done.stdout if done.returncode == 0 else done.stderr
            got = [line.rstrip() for line in said.splitlines() if line.strip()]
            assert got == [line.rstrip() for line in shown if line.strip()], f"$ {command}\n{done.stderr}"
            ran += 1
        assert ran >= 4 and len(services) == 2
    finally:
        for service in services:
            service.send_signal(signal.SIGTERM)
    for service in services:
        assert service.wait(HANG) == 0, f"{service.args} did not stop cleanly"


def start_service(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a service and wait until it says its unit started (its log goes to stderr, kept in a file)."""
    log = cwd / (command.split()[-1] + ".log")
    with log.open("w") as stderr:
        service = subprocess.Popen(
            command.split(), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True
        )
    deadline = time.monotonic() + HANG
    while "unit started" not in log.read_text():
        if service.poll() is not None or time.monotonic() > deadline:
            service.kill()
            pytest.fail(f"{command} did not start (exit {service.poll()}):\n{log.read_text()}")
        time.sleep(0.05)
    return service
