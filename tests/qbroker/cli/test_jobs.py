"""``qbroker call`` with progress and ``qbroker jobs`` against a real Spark bridge (local Spark)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
from pathlib import Path

import pytest

from tests.qbroker.cli.helpers import QBROKER, cli_env, run_cli
from tests.services.spark_bridge.conftest import bridge, spark  # noqa: F401 - the bridge's own fixtures

pytestmark = pytest.mark.usefixtures("bridge")  # a Spark bridge: heavy by its fixture


def render_log(path: Path) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "metatile": "9/0/0",
                    "zoom": 9,
                    "renderer": f"toposm.render.h{i % 2}.1.1",
                    "start": 1000.0 + i,
                    "duration": float(i),
                    "status": "ok",
                }
            )
            + "\n"
            for i in range(1, 11)
        )
    )
    return path


def stats_args(log: Path) -> list[str]:
    return [
        "call",
        "spark.stats",
        f"paths={json.dumps([str(log)])}",
        "wait=true",
        "window_seconds=5",
        "--timeout",
        "120",
    ]


async def test_call_prints_progress_lines_off_a_terminal_and_jobs_commands(amqp_url, tmp_path) -> None:
    result = await run_cli(amqp_url, *stats_args(render_log(tmp_path / "render.log")), timeout=150)
    assert result.code == 0, result.stderr
    assert "progress: stats " in result.stderr  # plain lines on stderr, no terminal codes
    assert "\x1b[" not in result.stderr
    job_id = result.json()["job_id"]
    listed = await run_cli(amqp_url, "jobs", "list")
    assert listed.code == 0 and any(
        line.split("\t")[:3] == [job_id, "stats", "succeeded"] for line in listed.stdout.splitlines()
    ), listed.stdout
    as_json = await run_cli(amqp_url, "jobs", "list", "--json", "--state", "succeeded")
    assert job_id in [j["job_id"] for j in as_json.json()["jobs"]]
    status = await run_cli(amqp_url, "jobs", "status", job_id)
    assert status.code == 0 and status.json()["state"] == "succeeded"
    watched = await run_cli(amqp_url, "jobs", "watch", job_id)
    assert watched.code == 0 and '"succeeded"' in watched.stdout
    unknown = await run_cli(amqp_url, "jobs", "cancel", "no-such-job")
    assert unknown.code == 2 and "unknown_job" in unknown.stderr
    bad = await run_cli(amqp_url, "jobs", "list", "--limit", "0")
    assert bad.code == 64


async def test_call_shows_a_progress_bar_on_a_terminal(amqp_url, tmp_path) -> None:
    master, slave = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        QBROKER,
        *stats_args(render_log(tmp_path / "render.log")),
        env={**cli_env(amqp_url), "TERM": "xterm"},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)

    def read_all() -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return b"".join(chunks)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    terminal, (out, _) = await asyncio.wait_for(asyncio.gather(asyncio.to_thread(read_all), proc.communicate()), 150)
    os.close(master)
    assert proc.returncode == 0, terminal.decode(errors="replace")
    shown = terminal.decode(errors="replace")
    assert "━" in shown and "stats " in shown  # rich's bar, with the job's description
    assert json.loads(out)["state"] == "succeeded"
