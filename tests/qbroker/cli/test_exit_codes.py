"""Every console script exits with the one table's codes (docs/cli.md, qbroker.exit_codes), saying why in one line.

Each script is run the way its installed wrapper runs it, three ways: with the broker down (a port nothing
listens on), with a wrong password for the real broker, and with a flag it does not have. No broker lets it
in: exit 3 and exactly one line on stderr, naming the broker without the password; a bad flag: exit 64 and
the usage. ``toposm-import`` never talks to the broker: it does its work (here: fails it, exit 1) whatever
the broker's state.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from harness import HANG
from qbroker.exit_codes import ExitCode
from tests.qbroker.cli.test_console_scripts_usage import SCRIPTS

ROOT = Path(__file__).resolve().parents[3]
WRONG_PASSWORD = "not-the-password-7f3a"  # noqa: S105 - the wrong one, whose absence from the output is checked
LIBRARY = ("qbroker", "qbroker-debug", "qbroker-dead-letter")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _arguments(script: str, tmp: Path) -> list[str]:
    """What the script needs besides a broker to get as far as connecting."""
    if script == "toposm-replicate":
        (tmp / "source").mkdir()
        (tmp / "source" / "state.txt").write_text("sequenceNumber=1\n")
        (tmp / "store" / "geometry").mkdir(parents=True)
        return ["--source", str(tmp / "source"), "--store", str(tmp / "store"), "--spool", str(tmp / "spool")]
    return {
        "qbroker": ["call", "example.echo", "text=hi"],
        "qbroker-debug": ["--duration", "5"],
        "qbroker-dead-letter": [],
        "toposm-queuemaster": ["--state-file", str(tmp / "queue.sqlite"), "--tile-root", str(tmp / "tiles")],
        "toposm-renderer": ["--tile-root", str(tmp / "tiles")],
        "toposm-render-list": ["--bbox", "0,0,1,1", "--zooms", "3"],
        "qbroker-spark-bridge": ["--state-dir", str(tmp / "bridge")],
        "toposm-web": ["--tile-root", str(tmp / "tiles"), "--port", "0"],
        "toposm-import": [str(tmp / "no-such-extract.osm.pbf"), "--store", str(tmp / "store")],
    }[script]


def _run(script: str, args: list[str], url: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    module, _, func = SCRIPTS[script].partition(":")
    # What the generated wrapper does: argv[0] is the script's name, the entry point's return is the exit code.
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {func} as f; sys.exit(f())"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QBROKER_", "TOPOSM_"))}
    env.update(QBROKER_URL=url, PYTHONPATH=str(ROOT), COLUMNS="100")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=2 * HANG,
    )


def _scripts() -> list[object]:
    assert set(LIBRARY) <= set(SCRIPTS) and len(SCRIPTS) >= 10
    # The services' programs import Mapnik, pyosmium, pyarrow or pyspark: 2-4 s of CPU apiece.
    return [pytest.param(s, marks=() if s in LIBRARY else pytest.mark.heavy) for s in sorted(SCRIPTS)]


def _wrong_password(amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    netloc = f"{parts.username or 'guest'}:{WRONG_PASSWORD}@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"exit {proc.returncode}, stderr:\n{proc.stderr}"
    return lines[0]


@pytest.mark.parametrize("script", _scripts())
def test_broker_down(script: str, tmp_path: Path) -> None:
    proc = _run(script, _arguments(script, tmp_path), f"amqp://guest:guest@127.0.0.1:{_closed_port()}/", tmp_path)
    line = _one_line(proc)
    if script == "toposm-import":
        assert proc.returncode == ExitCode.ERROR and "no such file" in line, proc.stderr
        return
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stderr
    assert "connection refused" in line and "127.0.0.1" in line and "guest:guest" not in line, line


@pytest.mark.parametrize("script", _scripts())
def test_wrong_password(script: str, tmp_path: Path, amqp_url: str) -> None:
    proc = _run(script, _arguments(script, tmp_path), _wrong_password(amqp_url), tmp_path)
    line = _one_line(proc)
    assert WRONG_PASSWORD not in proc.stdout + proc.stderr
    if script == "toposm-import":
        assert proc.returncode == ExitCode.ERROR and "no such file" in line, proc.stderr
        return
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stderr
    assert "authentication refused" in line and urlsplit(amqp_url).hostname in line, line


@pytest.mark.parametrize("script", _scripts())
def test_bad_flag(script: str, tmp_path: Path) -> None:
    proc = _run(
        script,
        [*_arguments(script, tmp_path), "--no-such-option"],
        f"amqp://guest:guest@127.0.0.1:{_closed_port()}/",
        tmp_path,
    )
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "usage" in proc.stderr.lower() and "--no-such-option" in proc.stderr, proc.stderr
    assert "unreachable" not in proc.stderr.lower() and "no broker" not in proc.stderr.lower(), proc.stderr
