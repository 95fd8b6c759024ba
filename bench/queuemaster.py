"""Queuemaster throughput on real RabbitMQ; prints one JSON document.

* ``dispatch``: metatiles rendered per second end to end with N test-pattern renderer processes
  (one render thread each): expire, dispatch, render 64 tiles, write them, report ``rendered``.
* ``dispatch_null``: the queuemaster's own dispatch capacity, with in-process "null" render threads that
  answer ``render`` and report ``rendered`` at once without drawing anything.
* ``null_vs_floor``: null dispatch (8 threads) and the sequential RPC floors of bench/peers_rpc.py
  (raw aiormq, direct reply-to and the QBroker structure) interleaved in rounds, with the ratio per round, and
  with ``--old COMMIT`` that commit's queuemaster (its ``services/`` from ``git archive``) in the same
  rounds. Each round reports the CPU per metatile of the queuemaster, the null renderers (this process)
  and RabbitMQ, and the queue's commits per metatile. The end of a round is the last acknowledged
  ``rendered``, counted by the null renderers: no ``stats`` polls weigh on the queuemaster.
* ``pick``: microseconds per background pick from a render queue of 10k and 100k metatiles, half of them
  raised to important; a logarithmic pick barely grows with the queue.
* ``expiry``: expiry tiles ingested per second from ``expire_toposm`` text alerts (1000 tiles per
  message, each a distinct metatile, all queued and persisted), ``--expiry-pairs`` fresh queuemasters
  (alternating with ``--old``'s).
* ``ingest`` and ``big_queue``: bench/queuemaster_scale.py (no bus): expiry ingestion in process, and
  the memory and pick time of a 10-million-metatile queue.

Run: ``.venv/bin/python bench/queuemaster.py [--only null_vs_floor,expiry] [--metatiles 200]``. Needs
rabbitmqctl (each run uses a fresh vhost) and the toposm console scripts in the virtualenv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import qbroker
from qbroker import Config, Unit
from qbroker.log import configure_logging

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.peers_report import machine  # noqa: E402
from bench.queuemaster_null import bench_dispatch_null, bench_dispatch_null_vs_floor  # noqa: E402
from bench.queuemaster_procs import (  # noqa: E402
    BIN,
    archive,
    cpu_seconds,
    metatile_tiles,
    queuemaster_args,
    queuemaster_command,
    start,
    stop,
    uptime,
    wait_for,
)
from bench.queuemaster_scale import bench_big_queue, bench_ingest  # noqa: E402
from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402
from services.toposm.contract import EXPIRE_TOPIC, QUEUEMASTER, join_expiry_list  # noqa: E402


async def bench_dispatch(n_renderers: int, n_metatiles: int, workdir: Path) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [start(queuemaster_args(workdir, "tiles"), url, workdir / "qm.log")]
    unit = Unit("bench.client", config=Config(url=url))
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        procs += [
            start(
                [
                    str(BIN / "toposm-renderer"),
                    "--threads",
                    "1",
                    "--backend",
                    "testpattern",
                    "--tile-root",
                    str(workdir / "tiles"),
                ],
                url,
                workdir / f"r{i}.log",
            )
            for i in range(n_renderers)
        ]
        await wait_for(unit, lambda s: len(s["renderers"]) == n_renderers, 60)
        t0 = time.perf_counter()
        await unit.call(QUEUEMASTER, {"command": "expire", "tiles": metatile_tiles(n_metatiles)})
        await wait_for(unit, lambda s: s["counters"]["rendered"] >= n_metatiles)
        elapsed = time.perf_counter() - t0
        return {
            "renderers": n_renderers,
            "metatiles": n_metatiles,
            "seconds": round(elapsed, 3),
            "metatiles_per_second": round(n_metatiles / elapsed, 2),
            "tiles_per_second": round(64 * n_metatiles / elapsed, 1),
        }
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


async def bench_expiry(
    n_messages: int, per_message: int, workdir: Path, services_from: Path | None = None
) -> dict[str, Any]:
    vhost = create_vhost("qbroker-bench")
    url = url_for_vhost(vhost)
    procs = [
        start(queuemaster_command(workdir, f"tiles-exp-{uuid.uuid4().hex}", services_from), url, workdir / "qm-exp.log")
    ]
    unit = Unit("bench.expirer", config=Config(url=url))
    tiles = metatile_tiles(n_messages * per_message, zoom=16)
    bodies = [join_expiry_list(tiles[i * per_message : (i + 1) * per_message]) for i in range(n_messages)]
    try:
        await unit.start()
        await wait_for(unit, lambda s: True)
        t0, cpu0 = time.perf_counter(), cpu_seconds(procs[0].pid)
        for body in bodies:
            await unit.alert(EXPIRE_TOPIC, body, content_type="text/plain")
        published = time.perf_counter() - t0
        total = n_messages * per_message
        s = await wait_for(unit, lambda s: s["counters"]["expired"] >= total)
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(procs[0].pid) - cpu0
        # Per CPU-second of the queuemaster process: steadier than wall time on a shared machine. (The
        # 50 ms stats polls that detect the end are included: a few of them per run.)
        return {
            "code": "old" if services_from else "new",
            "messages": n_messages,
            "tiles_per_message": per_message,
            "tiles": total,
            "queued": s["queues"]["total"],
            "seconds": round(elapsed, 3),
            "publishing_seconds": round(published, 3),
            "tiles_per_second": round(total / elapsed, 1),
            "tiles_per_queuemaster_cpu_second": round(total / cpu) if cpu > 0 else None,
            "load_average": os.getloadavg()[0],
        }
    finally:
        await unit.stop(drain_timeout=1)
        stop(procs)
        delete_vhost(vhost)


async def bench_expiry_pairs(
    pairs: int, n_messages: int, per_message: int, workdir: Path, old_services: Path | None
) -> dict[str, Any]:
    """The new code's expiry ingestion, alternating with the old code's when given, in fresh processes."""
    runs = []
    for _ in range(pairs):
        runs.append(await bench_expiry(n_messages, per_message, workdir))
        if old_services is not None:
            runs.append(await bench_expiry(n_messages, per_message, workdir, old_services))
    summary: dict[str, Any] = {}
    for code in ("new", "old"):
        mine = [r for r in runs if r["code"] == code]
        for key in ("tiles_per_second", "tiles_per_queuemaster_cpu_second"):
            if mine:
                summary[f"{code}_{key}"] = {
                    "median": statistics.median(r[key] for r in mine),
                    "min": min(r[key] for r in mine),
                    "max": max(r[key] for r in mine),
                }
    return {"runs": runs, "summary": summary}


def bench_pick(size: int, workdir: Path, picks: int = 2000) -> dict[str, Any]:
    from harness.queues import fill_half_raised
    from services.tiles.queuemaster.queue_store import QueueStore
    from services.tiles.queuemaster.render_queue import RenderQueue

    q = RenderQueue(QueueStore(workdir / f"pick-{size}.sqlite"))
    fill_half_raised(q, size)
    started = time.perf_counter()
    with q.batch():
        for _ in range(picks):
            q.pop(14)
    return {"queued": size, "picks": picks, "us_per_pick": round((time.perf_counter() - started) / picks * 1e6, 2)}


SCENARIOS = "dispatch,dispatch_null,null_vs_floor,expiry,ingest,pick,big_queue"


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metatiles", type=int, default=200)
    p.add_argument("--renderers", default="1,2,4")
    p.add_argument("--null-metatiles", type=int, default=3000)
    p.add_argument("--expiry-messages", type=int, default=100)
    p.add_argument("--expiry-pairs", type=int, default=3, help="expiry runs (each new, then old with --old)")
    p.add_argument("--rounds", type=int, default=3, help="null_vs_floor rounds")
    p.add_argument("--floor-calls", type=int, default=600, help="sequential floor calls per round")
    p.add_argument("--big-queue", type=int, default=10_000_000, help="metatiles queued by big_queue")
    p.add_argument(
        "--old",
        metavar="COMMIT",
        help="null_vs_floor and expiry also run this commit's queuemaster "
        "(its services/ from `git archive`), in the same rounds",
    )
    p.add_argument("--only", default=SCENARIOS, help=f"comma-separated subset of {SCENARIOS}")
    a = p.parse_args()
    only = set(a.only.split(","))
    configure_logging("WARNING")  # logs to stderr; stdout is the JSON result
    workdir = Path(tempfile.mkdtemp(prefix="toposm-bench-"))  # service logs are kept there on failure
    result: dict[str, Any] = {"machine": machine(), "uptime_before": uptime(), "load_average_before": os.getloadavg()}
    old_services = archive(a.old, workdir) if a.old else None
    if a.old:
        result["old_commit"] = a.old
    try:
        if "dispatch" in only:
            result["dispatch"] = [await bench_dispatch(int(n), a.metatiles, workdir) for n in a.renderers.split(",")]
        if "dispatch_null" in only:
            result["dispatch_null"] = [await bench_dispatch_null(n, a.null_metatiles, workdir) for n in (1, 8)]
        if "null_vs_floor" in only:
            result["null_vs_floor"] = await bench_dispatch_null_vs_floor(
                8, a.null_metatiles // a.rounds, a.rounds, a.floor_calls, workdir, old_services
            )
        if "expiry" in only:
            result["expiry"] = await bench_expiry_pairs(a.expiry_pairs, a.expiry_messages, 1000, workdir, old_services)
        if "ingest" in only:
            result["ingest"] = bench_ingest(200_000, workdir)
        if "pick" in only:
            result["pick"] = [bench_pick(size, workdir) for size in (10_000, 100_000)]
        if "big_queue" in only:
            result["big_queue"] = bench_big_queue(a.big_queue, workdir)
    except BaseException:
        print(f"benchmark failed; service logs in {workdir}", file=sys.stderr)
        raise
    result["load_average_after"] = os.getloadavg()
    result["uptime_after"] = uptime()
    shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    qbroker.run(main())  # uvloop when installed, as the services and bench/peers.py use
