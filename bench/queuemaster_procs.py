"""The processes of the queuemaster benchmarks (bench/queuemaster.py): starting a queuemaster (the working
tree's or an older commit's ``services/``), waiting on its ``stats``, stopping it, and the CPU time of it and
of RabbitMQ.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from qbroker import Unit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from services.toposm.contract import QUEUEMASTER  # noqa: E402

BIN = Path(sys.executable).parent


def start(args: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the process
    env = {**os.environ, "QBROKER_URL": url}
    return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def queuemaster_args(workdir: Path, tiles: str) -> list[str]:
    return [
        str(BIN / "toposm-queuemaster"),
        "--tile-root",
        str(workdir / tiles),
        "--state-file",
        str(workdir / f"q-{uuid.uuid4().hex}.sqlite"),
        "--render-missing-expired",
    ]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


async def wait_for(unit: Unit, check: Any, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = await unit.call(QUEUEMASTER, {"command": "stats"}, timeout=5)
            if check(s):
                return s  # type: ignore[no-any-return]
        except Exception:  # noqa: S110 - not up yet
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError("benchmark condition not reached")


def metatile_tiles(n: int, zoom: int = 14, first: int = 0) -> list[str]:
    """n distinct metatiles at a zoom, as their top-left tiles (the Spark expiry convention)."""
    side = (1 << zoom) >> 3
    return [f"{zoom}/{(i % side) * 8}/{(i // side) * 8}" for i in range(first, first + n)]


def rabbit_pids() -> list[int]:
    """The RabbitMQ server's Erlang VM (not the short-lived ones of rabbitmqctl, also beam.smp)."""
    found = subprocess.run(["pgrep", "-f", "beam.smp.* -s rabbit boot"], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def queuemaster_command(workdir: Path, tiles: str, services_from: Path | None) -> list[str]:
    args = queuemaster_args(workdir, tiles)
    if services_from is None:
        return args
    # Older code: its services/ first on the path (qbroker stays the working tree's, the same for both).
    return [
        sys.executable,
        "-c",
        "import sys; sys.path.insert(0, sys.argv.pop(1)); from services.tiles.queuemaster.main import main; main()",
        str(services_from),
        *args[1:],
    ]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def archive(commit: str, workdir: Path) -> Path:
    """``services/`` as of ``commit``, unpacked under workdir (the repo's qbroker stays in use)."""
    target = workdir / f"old-{commit}"
    target.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "services"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=tar.stdout, check=True)
    return target
