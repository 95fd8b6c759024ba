"""Benchmark of real-data expiry: import rate, and a minutely-sized diff through a warm bridge.

1. ``toposm-import`` of the Helsinki extract (bin/ensure-osm-data): objects per second for the whole pass
   (rendering store, geometry store, indexes, sea), best of ``--imports``.
2. An in-process Spark bridge (local session, warmed by one diff first) with ``--store`` on a throwaway
   vhost; a generated diff of ``--objects`` changed objects over the real store (node moves, tag-only
   way edits, new nodes and ways, deleted ways: the mix of a busy minutely diff) goes in with
   ``spark.expire`` (store, sequence, wait). Measured from the call to the last ``expire_toposm`` message
   received by a listener, and to the reply (the geometry store commit comes after publishing). Each run
   gets a fresh copy of the store (copied outside the timing).

    .venv/bin/python bench/osm_expire.py [--objects 10000] [--runs 3] [--imports 3]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402
from harness.osm import Extract, helsinki_extract, node_xml, osc, read_extract, way_xml  # noqa: E402
from qbroker import Config, Unit  # noqa: E402
from services.osmstore.importer import import_extract  # noqa: E402
from services.spark_bridge.limits import BridgeLimits  # noqa: E402
from services.spark_bridge.service import SparkBridge  # noqa: E402
from services.spark_bridge.spark_session import build_session  # noqa: E402
from services.toposm.contract import EXPIRE_TOPIC, SPARK_BRIDGE, SPARK_EXPIRE  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def make_diff(extract: Extract, objects: int, seed: int) -> str:
    """``objects`` changed objects: 60% node moves, 25% tag-only way edits, 5% deleted ways, 10% new
    nodes and ways (a new way every 4 new nodes)."""
    rng = random.Random(seed)
    nodes = rng.sample(sorted(extract.nodes), min(len(extract.nodes), objects * 60 // 100))
    ways = rng.sample(sorted(extract.ways), min(len(extract.ways), objects * 30 // 100))
    edited, deleted = ways[: len(ways) * 5 // 6], ways[len(ways) * 5 // 6 :]
    modify = [
        node_xml(
            n, extract.nodes[n][0] + rng.uniform(-2e-4, 2e-4), extract.nodes[n][1] + rng.uniform(-1e-4, 1e-4), version=5
        )
        for n in nodes
    ]
    modify += [way_xml(w, extract.ways[w][0], {**extract.ways[w][1], "note": "bench"}, version=5) for w in edited]
    delete = [f'<way id="{w}" version="6"/>' for w in deleted]
    create: list[str] = []
    new_nodes = objects - len(modify) - len(delete)
    base = 9_500_000_000
    for i in range(max(new_nodes, 0)):
        create.append(node_xml(base + i, 24.93 + rng.uniform(0, 0.03), 60.16 + rng.uniform(0, 0.015), version=1))
        if i % 4 == 3:
            create.append(
                way_xml(
                    base + 10_000_000 + i,
                    [base + i - 3, base + i - 2, base + i - 1, base + i],
                    {"highway": "footway"},
                    version=1,
                )
            )
    return osc(create=create, modify=modify, delete=delete)


def bench_import(extract: Path, runs: int) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            info = import_extract(extract, Path(tmp) / "s")
        if best is None or info["seconds"] < best["seconds"]:
            best = info
    assert best is not None
    objects = sum(best["counts"].values())
    return {
        "extract": extract.name,
        "bytes": best["source_size"],
        "objects": objects,
        "counts": best["counts"],
        "seconds": best["seconds"],
        "objects_per_second": round(objects / best["seconds"]),
    }


class TimedExpire:
    """A client unit calling ``spark.expire`` with ``wait``, timed from the call to its reply and to the last
    ``expire_toposm`` message it published (a listener here counts them; bench/spark_small_job.py too)."""

    def __init__(self, url: str) -> None:
        self.unit = Unit("bench.client", config=Config(url=url))
        self._arrivals: list[float] = []
        self._expected: int | None = None
        self._all_in = asyncio.Event()

        @self.unit.on_alert(EXPIRE_TOPIC)
        async def on_expire(body: str) -> None:
            self._arrivals.append(time.perf_counter())
            self._check()

    def _check(self) -> None:
        if self._expected is not None and len(self._arrivals) >= self._expected:
            self._all_in.set()

    async def call(self, params: dict[str, Any], *, settle: float) -> tuple[dict[str, Any], float | None, float]:
        """(the reply, seconds to the last expiration or None if none came within ``settle`` after the
        reply, seconds to the reply)."""
        self._arrivals.clear()
        self._expected = None
        self._all_in.clear()
        started = time.perf_counter()
        reply: dict[str, Any] = await self.unit.call(SPARK_EXPIRE, {**params, "wait": True}, timeout=3600)
        replied = time.perf_counter()
        self._expected = reply["result"]["published"]["messages"]
        self._check()
        with contextlib.suppress(TimeoutError):  # reported as missing (None), not a crash of the bench
            await asyncio.wait_for(self._all_in.wait(), settle)
        last = self._arrivals[-1] - started if self._arrivals else None
        return reply, last, replied - started


async def bench_expire(store: Path, work: Path, objects: int, runs: int, url: str) -> dict[str, Any]:
    extract = read_extract(ROOT / "var" / "osm" / "Helsinki.osm.pbf")
    spark = build_session(
        "local[2]", "bench-osm-expire", {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    bridge_unit = Unit(SPARK_BRIDGE, config=Config(url=url))
    client = TimedExpire(url)
    live = work / "store"
    shutil.copytree(store, live)
    bridge = SparkBridge(
        bridge_unit,
        spark,
        work / "state",
        max_jobs=1,
        input_roots=[work],
        stores=[live],
        limits=BridgeLimits(max_tiles=10**9, max_tiles_per_geometry=10**9),
    )
    await bridge_unit.start()
    await client.unit.start()
    results = []
    try:
        for run in range(runs + 1):  # run 0 warms the session (JIT, Parquet readers) and is not reported
            shutil.rmtree(live)
            shutil.copytree(store, live)
            diff = work / f"diff-{run}.osc.gz"
            diff.write_bytes(gzip.compress(make_diff(extract, objects, seed=run).encode()))
            reply, last, to_reply = await client.call(
                {"paths": [str(diff)], "store": live.name, "sequence": 1, "min_zoom": 10, "max_zoom": 18}, settle=60
            )
            result = reply["result"]
            if run == 0:
                continue
            results.append(
                {
                    "seconds_to_last_expiration": round(last, 3) if last is not None else None,
                    "seconds_to_reply": round(to_reply, 3),
                    "changed_objects": result["inputs"]["osc_nodes"] + result["inputs"]["osc_ways"],
                    "ways_expired": result["inputs"]["ways"],
                    "total_tiles": result["total_tiles"],
                    "total_metatiles": result["total_metatiles"],
                    "messages": result["published"]["messages"],
                }
            )
    finally:
        await client.unit.stop()
        await bridge.close()
        await bridge_unit.stop()
        spark.stop()
    return {"objects": objects, "zooms": "10-18", "runs": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--imports", type=int, default=3)
    a = p.parse_args()
    extract = helsinki_extract()
    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg": os.getloadavg(),
        }
    }
    out["import"] = bench_import(extract, a.imports)
    vhost = create_vhost("qbroker-bench")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "helsinki"
            import_extract(extract, store)
            work = Path(tmp) / "work"
            work.mkdir()
            out["expire"] = asyncio.run(bench_expire(store, work, a.objects, a.runs, url_for_vhost(vhost)))
    finally:
        delete_vhost(vhost)
    out["machine"]["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
