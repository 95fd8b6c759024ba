"""``toposm-replicate --once`` over the demo's replication directory (the diff demo/osm_changes.py published)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from demo.leftovers import PidFile

BIN = Path(sys.executable).parent
ERROR_TAIL = 1000  # characters of a failed run's output in the error; all of it is in WORKDIR/replicate.log


async def replicate(workdir: Path, store: Path, env: dict[str, str] | None) -> dict[str, Any]:
    """Run toposm-replicate once over the demo's replication directory; returns STORE/replication.json."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "toposm-replicate"),
        "--source",
        str(workdir / "replication"),
        "--store",
        str(store),
        "--start",
        "1",
        "--once",
        "--min-zoom",
        "12",
        "--max-zoom",
        "17",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    PidFile(workdir).add(proc.pid)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 600)
    except BaseException:  # interrupted (a signal, a timeout): it must not outlive the demo
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    log = workdir / "replicate.log"
    log.write_bytes(out)
    if proc.returncode != 0:
        text = out.decode(errors="replace")
        if len(text) > ERROR_TAIL:
            text = f"… ({len(text) - ERROR_TAIL} characters before: {log})\n{text[-ERROR_TAIL:]}"
        raise RuntimeError(f"toposm-replicate failed ({proc.returncode}): {text}")
    status: dict[str, Any] = json.loads((store / "replication.json").read_text())
    return status
