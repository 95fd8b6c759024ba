"""What parked render requests cost the queuemaster, and how fast it stops with them; prints one JSON document.

For each code (this tree's, and with ``--old COMMIT`` that commit's ``services/`` and ``qbroker/`` from
``git archive``, in the same run), a fresh queuemaster process on a fresh vhost, no renderer: one client
parks N ``render`` requests for one metatile (the issue's attack, from one account). Reported: the
queuemaster's RSS before and with the N waiting (and per waiter), how long a ``stats`` call takes then, how
long from SIGTERM to the process's exit, and what its stop logged (drain, answers, abandoned handlers).
This tree's queuemaster is given ``--max-waits-per-account N`` so that one account may park them all.

Run: ``.venv/bin/python bench/queuemaster_waits.py --waits 20000 --old main``. Needs rabbitmqctl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.peers_report import machine  # noqa: E402
from bench.queuemaster_procs import uptime  # noqa: E402
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402
from qbroker import Config, Unit  # noqa: E402

QUEUEMASTER = "toposm.queuemaster"
STOP_EVENTS = ("stopping", "drain timed out", "handlers abandoned", "waiting requests answered at stop", "unit stopped")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def stats(unit: Unit) -> dict[str, Any]:
    result: dict[str, Any] = await unit.call(QUEUEMASTER, {"command": "stats"}, timeout=120)
    return result


async def until(unit: Unit, check: Any, timeout: float = 600.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = await stats(unit)
            if check(s):
                return s
        except Exception:  # noqa: S110 - not up yet
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("benchmark condition not reached")


async def one(code: str, pythonpath: Path, waits: int, workdir: Path) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    log = workdir / f"{code}.log"
    args = [
        sys.executable,
        "-m",
        "services.tiles.queuemaster.main",
        "--tile-root",
        str(workdir / "tiles"),
        "--state-file",
        str(workdir / f"{code}.sqlite"),
    ]
    if code == "new":
        args += ["--max-waits-per-account", str(waits), "--max-waits", str(waits + 1)]
    env = {**os.environ, "QBROKER_URL": url, "PYTHONPATH": str(pythonpath), "QBROKER_LOG_FORMAT": "json"}
    with open(log, "wb") as out:
        # cwd too: `-m` puts it first on sys.path, before PYTHONPATH
        proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=pythonpath
        )
    unit = Unit("bench.client", config=Config(url=url))
    calls: list[asyncio.Task[Any]] = []
    try:
        await unit.start()
        await until(unit, lambda s: True)
        before = rss_mb(proc.pid)
        started = time.perf_counter()
        calls = [
            asyncio.create_task(unit.call(QUEUEMASTER, {"command": "render", "tile": "18/0/0"}, timeout=3600))
            for _ in range(waits)
        ]
        await until(unit, lambda s: s["waiting_requests"] >= waits)
        parked_s = time.perf_counter() - started
        with_waits = rss_mb(proc.pid)
        t0 = time.perf_counter()
        await stats(unit)
        stats_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        os.killpg(proc.pid, signal.SIGTERM)
        code_exit = await asyncio.to_thread(proc.wait, 600)
        stop_s = time.perf_counter() - t0
        events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        stop_log = [
            {k: v for k, v in e.items() if k not in ("app", "uuid", "level")}
            for e in events
            if e["event"].startswith(STOP_EVENTS)
        ]
        return {
            "code": code,
            "waits": waits,
            "rss_mb_before": round(before, 1),
            "rss_mb_with_waits": round(with_waits, 1),
            "kb_per_wait": round((with_waits - before) * 1024 / waits, 2),
            "parking_s": round(parked_s, 2),
            "stats_s": round(stats_s, 3),
            "sigterm_to_exit_s": round(stop_s, 2),
            "exit_code": code_exit,
            "stop_log": stop_log,
        }
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await unit.stop(drain_timeout=1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        delete_vhost(vhost)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--waits", type=int, default=20_000, help="render requests parked (default 20000)")
    p.add_argument("--old", metavar="COMMIT", help="also run that commit's queuemaster, in the same run")
    a = p.parse_args()
    result: dict[str, Any] = {"bench": "queuemaster_waits", "machine": machine(), "load_before": uptime()}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        runs = [await one("new", ROOT, a.waits, workdir)]
        if a.old:
            old = workdir / "old"  # the whole tree: `services` and `qbroker` as they were, packages and all
            old.mkdir()
            tar = subprocess.run(["git", "-C", str(ROOT), "archive", a.old], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", str(old)], input=tar.stdout, check=True)
            result["old_commit"] = a.old
            runs.append(await one("old", old, a.waits, workdir))
    result["runs"] = runs
    if len(runs) == 2:
        new, old_run = runs
        result["new_over_old"] = {
            key: round(new[key] / old_run[key], 3) if old_run[key] else None
            for key in ("kb_per_wait", "stats_s", "sigterm_to_exit_s")
        }
    result["load_after"] = uptime()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
