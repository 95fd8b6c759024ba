"""Every console script answers ``--help`` and a bad argument with its usage, and ``--version`` with its
distribution's version, without touching the broker.

The scripts are read from both pyproject files' ``[project.scripts]`` (a new one is covered without editing
this test) and run the way their installed wrappers run them, against a QBROKER_URL whose port nothing listens
on: a script that tried to connect would say the broker is unreachable, or hang retrying.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import qbroker
from harness import HANG
from services import toposm

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS: dict[str, str] = {
    script: target
    for pyproject in (ROOT / "pyproject.toml", ROOT / "services" / "pyproject.toml")
    for script, target in tomllib.loads(pyproject.read_text())["project"]["scripts"].items()
}
SCRIPT_HANG = 2 * HANG  # only catches a script that never returns; a healthy one answers in about a second
# Usage errors exit 64 (EX_USAGE) in every script: 2 is a remote `fail` (docs/cli.md).
USAGE_EXIT_CODES = (64,)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(script: str, target: str, arg: str, env: dict[str, str]) -> subprocess.Popen[str]:
    module, _, func = target.partition(":")
    # What the generated wrapper does: argv[0] is the script's name, the entry point's return is the exit code.
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {func} as f; sys.exit(f())"
    return subprocess.Popen(
        [sys.executable, "-c", code, arg],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _library(target: str) -> bool:
    return target.startswith("qbroker.")


def test_the_librarys_console_scripts_print_usage_without_a_broker() -> None:
    assert "qbroker-dead-letter" in SCRIPTS  # the one that started a collector on --help
    _check_usage({script: target for script, target in SCRIPTS.items() if _library(target)})


@pytest.mark.heavy  # each service's program imports Mapnik, pyosmium, pyarrow or pyspark: 2-4 s of CPU apiece
def test_the_services_console_scripts_print_usage_without_a_broker() -> None:
    _check_usage({script: target for script, target in SCRIPTS.items() if not _library(target)})


def _check_usage(scripts: dict[str, str]) -> None:
    assert scripts
    url = f"amqp://guest:guest@127.0.0.1:{_closed_port()}/"
    env = dict(os.environ, QBROKER_URL=url, PYTHONPATH=str(ROOT), COLUMNS="100")
    runs = {
        (script, arg): _launch(script, target, arg, env)
        for script, target in scripts.items()
        for arg in ("--help", "--no-such-option", "--version")
    }
    problems: list[str] = []
    for (script, arg), proc in runs.items():
        try:
            out, err = proc.communicate(timeout=SCRIPT_HANG)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            problems.append(f"{script} {arg}: still running after {SCRIPT_HANG} s")
            continue
        text = out + err
        if arg == "--version":
            version = qbroker.__version__ if _library(scripts[script]) else toposm.__version__
            if (proc.returncode, out) != (0, f"{script} {version}\n"):
                problems.append(f"{script} --version: exit {proc.returncode}: {text[-400:]!r}")
            continue
        wanted = (0,) if arg == "--help" else USAGE_EXIT_CODES
        if proc.returncode not in wanted:
            problems.append(f"{script} {arg}: exit {proc.returncode}, wanted {wanted}: {text[-400:]!r}")
        if "usage" not in text.lower():
            problems.append(f"{script} {arg}: no usage printed: {text[-400:]!r}")
        if "unreachable" in text.lower() or "connection refused" in text.lower():
            problems.append(f"{script} {arg}: tried the broker: {text[-400:]!r}")
    assert not problems, "\n".join(problems)
