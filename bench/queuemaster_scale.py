"""The queuemaster's queue at scale, without the bus; prints JSON (bench/queuemaster.py runs these too).

* ``ingest``: expiry tiles per second through ``Queuemaster.expire`` (parse, dedupe by metatile, queue,
  commit), 1000 tiles per message, each a distinct metatile; wall clock and CPU time (the machine is
  shared, so tiles per CPU-second is the steadier figure).
* ``big_queue``: fill the queue to N metatiles (default 10 million) through the same bulk path and report
  the process's memory (RSS) and the state file's size; at each decade (10k, 100k, 1M, 10M) time picks
  from a queue with half of it raised to important, so a pick that grew with n would show.

    .venv/bin/python bench/queuemaster_scale.py [--big-queue 10000000] [--ingest-tiles 200000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from services.tiles.queuemaster.queue_store import QueueStore  # noqa: E402
from services.tiles.queuemaster.render_queue import RenderQueue  # noqa: E402
from services.tiles.queuemaster.state_machine import Queuemaster, QueuemasterSettings  # noqa: E402
from services.toposm.contract import join_expiry_list  # noqa: E402
from services.toposm.tilemath import Metatile  # noqa: E402


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory (VmRSS now, VmHWM peak) in MiB, from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def expiry_bodies(n_tiles: int, per_message: int, zoom: int = 16) -> list[str]:
    """Messages of distinct metatiles, as their top-left tiles (the Spark expiry convention)."""
    side = (1 << zoom) >> 3
    tiles = [f"{zoom}/{(i % side) * 8}/{(i // side) * 8}" for i in range(n_tiles)]
    return [join_expiry_list(tiles[i : i + per_message]) for i in range(0, n_tiles, per_message)]


def bench_ingest(n_tiles: int, workdir: Path, per_message: int = 1000) -> dict[str, Any]:
    qm = Queuemaster(
        QueuemasterSettings(
            tile_root=workdir / "tiles-ingest", state_file=workdir / "ingest.sqlite", render_missing_expired=True
        )
    )
    bodies = expiry_bodies(n_tiles, per_message)
    wall, cpu = time.perf_counter(), time.process_time()
    for body in bodies:
        qm.expire(body, strict=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    queued = qm.queue.queued_count()
    qm.close()
    return {
        "tiles": n_tiles,
        "tiles_per_message": per_message,
        "queued": queued,
        "seconds": round(wall, 3),
        "tiles_per_second": round(n_tiles / wall),
        "tiles_per_cpu_second": round(n_tiles / cpu),
    }


def _time_picks(q: RenderQueue, source: int | str, picks: int, *, batch: bool = False) -> float:
    """Microseconds per pick: each committed on its own, or (``batch``) the index descent alone."""
    taken: list[Metatile] = []
    started = time.perf_counter()
    with q.batch() if batch else contextlib.nullcontext():
        for _ in range(picks):
            m = q.pop(source)
            if m is not None:
                taken.append(m)
    elapsed = time.perf_counter() - started
    with q.batch():
        for m in taken:
            q.put_back(m)  # leave the queue as it was for the next decade
    return elapsed / max(1, len(taken)) * 1e6


def bench_big_queue(size: int, workdir: Path, picks: int = 2000, chunk: int = 10_000) -> dict[str, Any]:
    """Fill to ``size`` z18 metatiles; half are then raised to important (a request while stale)."""
    rss_before = rss_mb()
    state = workdir / "big.sqlite"
    q = RenderQueue(QueueStore(state))
    side = (1 << 18) >> 3
    decades = [d for d in (10_000, 100_000, 1_000_000, 10_000_000, 100_000_000) if d <= size] or [size]
    if decades[-1] != size:
        decades.append(size)
    filled, fill_seconds = 0, 0.0
    picks_at: list[dict[str, Any]] = []
    for target in decades:
        started = time.perf_counter()
        while filled < target:
            n = min(chunk, target - filled)
            # In address order (a region expiring column by column): appends to the B-tree.
            q.add_expired([Metatile(18, i // side, i % side) for i in range(filled, filled + n)])
            filled += n
        fill_seconds += time.perf_counter() - started
        picks_at.append(
            {
                "queued": q.queued_count(),
                "us_per_pick": round(_time_picks(q, 18, picks), 1),
                "us_per_pick_uncommitted": round(_time_picks(q, 18, picks, batch=True), 1),
            }
        )
    raised = min(size // 2, 100_000)  # raising is per request, so a sample of them, not millions
    with q.batch():
        for i in range(0, 2 * raised, 2):
            q.add(Metatile(18, i // side, i % side), "important")
    mixed = {
        "queued": q.queued_count(),
        "raised_to_important": raised,
        "us_per_background_pick": round(_time_picks(q, 18, picks), 1),
        "us_per_important_pick": round(_time_picks(q, "important", picks), 1),
    }
    return {
        "metatiles": size,
        "fill_seconds": round(fill_seconds, 1),
        "fill_metatiles_per_second": round(size / fill_seconds),
        "picks": picks_at,
        "after_raising": mixed,
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_mb(),
        "rss_mb_peak": rss_mb("VmHWM"),
        "state_file_mb": round(sum(p.stat().st_size for p in workdir.glob("big.sqlite*")) / 2**20, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--big-queue", type=int, default=10_000_000)
    p.add_argument("--ingest-tiles", type=int, default=200_000)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="toposm-scale-") as tmp:
        result = {
            "cpus": os.cpu_count(),
            "ingest": bench_ingest(a.ingest_tiles, Path(tmp)),
            "big_queue": bench_big_queue(a.big_queue, Path(tmp)),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
