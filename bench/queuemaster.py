"""Queuemaster throughput on real RabbitMQ; prints one JSON document.

* ``dispatch``: metatiles rendered per second end to end with N test-pattern renderer processes
  (one render thread each): expire, dispatch, render 64 tiles, write them, report ``rendered``.
* ``dispatch_null``: the queuemaster's own dispatch capacity, with in-process "null" render threads that
  answer ``render`` and report ``rendered`` at once without drawing anything.
* ``pick``: microseconds per background pick from a render queue of 10k and 100k metatiles, half of them
  raised to important (stale heap entries to skip); a logarithmic pick barely grows with the queue.
* ``expiry``: expiry tiles ingested per second from ``expire_toposm`` text alerts (1000 tiles per
  message, each a distinct metatile, all queued and persisted).

Run: ``.venv/bin/python bench/queuemaster.py [--metatiles 200] [--renderers 1,2,4]``. Needs rabbitmqctl
(each run uses a fresh vhost) and the toposm console scripts in the virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from qbroker import Config, Unit
from qbroker.log import configure_logging

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402

BIN = Path(sys.executable).parent


def start(args: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - lives as long as the process
    env = {**os.environ, "QBROKER_URL": url}
    return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def queuemaster_args(workdir: Path, tiles: str) -> list[str]:
    return [str(BIN / "toposm-queuemaster"), "--tile-root", str(workdir / tiles), "--state-file",
            str(workdir / f"q-{uuid.uuid4().hex}.sqlite"), "--render-missing-expired"]


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
            s = await unit.call("toposm.queuemaster", {"command": "stats"}, timeout=5)
            if check(s):
                return s  # type: ignore[no-any-return]
        except Exception:  # noqa: S110 - not up yet
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError("benchmark condition not reached")


def metatile_tiles(n: int, zoom: int = 14) -> list[str]:
    """n distinct metatiles at a zoom, as their top-left tiles (the Spark expiry convention)."""
    side = (1 << zoom) >> 3
    return [f"{zoom}/{(i % side) * 8}/{(i // side) * 8}" for i in range(n)]


async def bench_dispatch(n_renderers: int, n_metatiles: int, workdir: Path) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [start(queuemaster_args(workdir, "tiles"), url, workdir / "qm.log")]
    unit = Unit("bench.client", config=Config(url=url))
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        procs += [start([str(BIN / "toposm-renderer"), "--threads", "1", "--backend", "testpattern",
                         "--tile-root", str(workdir / "tiles")], url, workdir / f"r{i}.log")
                  for i in range(n_renderers)]
        await wait_for(unit, lambda s: len(s["renderers"]) == n_renderers, 60)
        t0 = time.perf_counter()
        await unit.call("toposm.queuemaster", {"command": "expire", "tiles": metatile_tiles(n_metatiles)})
        await wait_for(unit, lambda s: s["counters"]["rendered"] >= n_metatiles)
        elapsed = time.perf_counter() - t0
        return {"renderers": n_renderers, "metatiles": n_metatiles, "seconds": round(elapsed, 3),
                "metatiles_per_second": round(n_metatiles / elapsed, 2),
                "tiles_per_second": round(64 * n_metatiles / elapsed, 1)}
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


def null_renderer(unit: Unit, threadid: int) -> None:
    """A render thread that reports `rendered` immediately: measures the queuemaster, not rendering."""
    name = f"toposm.render.bench.{os.getpid()}.{threadid}"
    endpoint = unit.commands(name, exclusive=True)
    tasks: set[asyncio.Task[Any]] = set()

    async def report(metatile: str) -> None:
        await unit.call("toposm.queuemaster", {"command": "rendered", "metatile": metatile, "duration": 0.0})

    @endpoint.command("render")
    async def render(metatile: str) -> dict[str, Any]:
        task = asyncio.ensure_future(report(metatile))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return {"command": "accepted"}

    @endpoint.command("ping")
    async def ping() -> dict[str, Any]:
        return {"command": "pong", "state": "idle"}


async def bench_dispatch_null(n_threads: int, n_metatiles: int, workdir: Path) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [start(queuemaster_args(workdir, "tiles-null"), url, workdir / "qm-null.log")]
    unit = Unit("bench.null-renderer", config=Config(url=url))
    for i in range(n_threads):
        null_renderer(unit, i)
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        for i in range(n_threads):
            await unit.call("toposm.queuemaster", {"command": "register", "hostname": "bench",
                                                   "pid": os.getpid(), "threadid": i, "strategy": "by_zoom"})
        t0 = time.perf_counter()
        await unit.call("toposm.queuemaster", {"command": "expire", "tiles": metatile_tiles(n_metatiles)})
        await wait_for(unit, lambda s: s["counters"]["rendered"] >= n_metatiles)
        elapsed = time.perf_counter() - t0
        return {"null_render_threads": n_threads, "metatiles": n_metatiles, "seconds": round(elapsed, 3),
                "metatiles_per_second": round(n_metatiles / elapsed, 1)}
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


async def bench_expiry(n_messages: int, per_message: int, workdir: Path) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [start(queuemaster_args(workdir, "tiles-exp"), url, workdir / "qm-exp.log")]
    unit = Unit("bench.expirer", config=Config(url=url))
    tiles = metatile_tiles(n_messages * per_message, zoom=16)
    bodies = [";".join(tiles[i * per_message:(i + 1) * per_message]) for i in range(n_messages)]
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        t0 = time.perf_counter()
        for body in bodies:
            await unit.alert("expire_toposm", body, content_type="text/plain")
        total = n_messages * per_message
        s = await wait_for(unit, lambda s: s["counters"]["expired"] >= total)
        elapsed = time.perf_counter() - t0
        return {"messages": n_messages, "tiles_per_message": per_message, "tiles": total,
                "queued": s["queues"]["total"], "seconds": round(elapsed, 3),
                "tiles_per_second": round(total / elapsed, 1)}
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


def bench_pick(size: int, workdir: Path, picks: int = 2000) -> dict[str, Any]:
    from services.tiles.queuemaster.queue_store import QueueStore
    from services.tiles.queuemaster.render_queue import RenderQueue
    from tests.tiles.queues import fill_half_raised

    q = RenderQueue(QueueStore(workdir / f"pick-{size}.sqlite"))
    fill_half_raised(q, size)
    started = time.perf_counter()
    with q.batch():
        for _ in range(picks):
            q.pop(14)
    return {"queued": size, "picks": picks, "us_per_pick": round((time.perf_counter() - started) / picks * 1e6, 2)}


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metatiles", type=int, default=200)
    p.add_argument("--renderers", default="1,2,4")
    p.add_argument("--null-metatiles", type=int, default=3000)
    p.add_argument("--expiry-messages", type=int, default=100)
    a = p.parse_args()
    configure_logging("WARNING")  # logs to stderr; stdout is the JSON result
    workdir = Path(tempfile.mkdtemp(prefix="toposm-bench-"))  # service logs are kept there on failure
    try:
        result: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "processor": platform.processor() or platform.machine()},
            "dispatch": [await bench_dispatch(int(n), a.metatiles, workdir) for n in a.renderers.split(",")],
            "dispatch_null": [await bench_dispatch_null(n, a.null_metatiles, workdir) for n in (1, 8)],
            "expiry": await bench_expiry(a.expiry_messages, 1000, workdir),
            "pick": [bench_pick(size, workdir) for size in (10_000, 100_000)],
        }
    except BaseException:
        print(f"benchmark failed; service logs in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
