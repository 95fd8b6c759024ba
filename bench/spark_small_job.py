"""Small Spark bridge jobs end to end through the bus, on a warm bridge: the fixed cost of a job.

Each measurement is a ``spark.expire`` call with ``wait=true`` from a client unit to an in-process bridge
(its own warm local session, the bridge's default Spark configuration), timed from the call to the last
``expire_toposm`` message a listener receives (and to the reply). Inputs are made before the clock starts;
nothing is downloaded (the Helsinki extract comes from bin/ensure-osm-data, like the tests and the demo).

- ``tiles``: an expire list of ``--tiles`` distinct z18 tiles over central Helsinki (zooms 10-18);
- ``diff``: a store-backed diff of ``--objects`` changed objects against the imported Helsinki store
  (bench/osm_expire.py's mix: node moves, tag-only way edits, deleted ways, new nodes and ways), applied
  with its sequence to a fresh copy of the store each run;
- ``--scaling 1000000,10000000``: expire lists of that many random z18 tiles in a 4096x4096-tile region
  (bench/expire.py's input) through the same path, for the time ratio against input size.

``spark_jobs`` is the number of Spark jobs the call ran (status tracker, the job's group).
``--compare REV`` runs the code of git revision REV (``git archive REV services`` into a temp dir) and the
working tree alternately, each in fresh processes, ``--pairs`` times, and reports old/new ratios of medians.

    .venv/bin/python bench/spark_small_job.py [--runs 5] [--pairs 2] [--compare a38f939] [--scaling 1000000]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ZOOMS = (10, 18)


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: import the bridge from ``--code`` (or the working tree), measure, return the runs."""
    sys.path.insert(0, str(ROOT))
    if args.code:
        sys.path.insert(0, args.code)  # before ROOT: its services/ shadows the working tree's
    import asyncio
    import gzip
    import random
    import shutil

    import numpy as np

    from harness.broker import create_vhost, delete_vhost, url_for_vhost
    from harness.osm import read_extract
    from qbroker import Config, Unit
    from services.osmstore.importer import import_extract
    from services.spark_bridge import service as bridge_service
    from services.spark_bridge.limits import BridgeLimits
    from services.spark_bridge.service import SparkBridge
    from services.spark_bridge.spark_session import build_session, job_tag
    from services.toposm.contract import SPARK_BRIDGE

    sys.path.insert(0, str(ROOT / "bench"))
    from osm_expire import TimedExpire, make_diff

    helsinki = ROOT / "var" / "osm" / "Helsinki.osm.pbf"
    extract = read_extract(helsinki)
    rng = random.Random(14)

    def tile_list(path: Path, n: int) -> Path:
        # Distinct z18 tiles over central Helsinki (the extract spans ~1,200 x 700 z18 tiles here).
        x0, y0 = 149_000, 75_700
        picked: set[tuple[int, int]] = set()
        while len(picked) < n:
            picked.add((x0 + rng.randrange(1_200), y0 + rng.randrange(700)))
        path.write_text("".join(f"18/{x}/{y}\n" for x, y in picked))
        return path

    def big_list(path: Path, n: int) -> Path:
        g = np.random.default_rng(18)
        x = 136_000 + g.integers(0, 4096, n, dtype=np.int64)
        y = 90_000 + g.integers(0, 4096, n, dtype=np.int64)
        with path.open("w") as out:
            for start in range(0, n, 1_000_000):
                xs, ys = x[start : start + 1_000_000], y[start : start + 1_000_000]
                out.write("".join(f"18/{a}/{b}\n" for a, b in zip(xs.tolist(), ys.tolist(), strict=True)))
        return path

    async def measure(tmp: Path, url: str) -> dict[str, Any]:
        spark = build_session(
            "local[*]", "bench-spark-small-job", {"spark.ui.enabled": "false", "spark.driver.memory": "4g"}
        )
        spark.sparkContext.setLogLevel("ERROR")
        tracker = spark.sparkContext.statusTracker()
        store = tmp / "helsinki"
        import_extract(helsinki, store)
        work = tmp / "work"
        work.mkdir()
        live = work / "store"
        shutil.copytree(store, live)
        bridge_unit = Unit(SPARK_BRIDGE, config=Config(url=url))
        client = TimedExpire(url)
        bridge = SparkBridge(
            bridge_unit, spark, work / "state", max_jobs=1, input_roots=[work], stores=[live], limits=BridgeLimits()
        )
        await bridge_unit.start()
        await client.unit.start()

        async def call(params: dict[str, Any]) -> dict[str, Any]:
            reply, last, to_reply = await client.call(
                {**params, "min_zoom": ZOOMS[0], "max_zoom": ZOOMS[1]}, settle=120
            )
            result = reply["result"]
            return {
                "seconds_to_last_expiration": round(last, 3) if last is not None else None,
                "seconds_to_reply": round(to_reply, 3),
                "spark_jobs": len(tracker.getJobIdsForGroup(job_tag(reply["job_id"]))),
                "total_tiles": result["total_tiles"],
                "total_metatiles": result["total_metatiles"],
                "messages": result["published"]["messages"],
                "inputs": result["inputs"],
            }

        async def diff_run(seed: int) -> dict[str, Any]:
            shutil.rmtree(live)
            shutil.copytree(store, live)
            diff = work / f"diff-{seed}.osc.gz"
            diff.write_bytes(gzip.compress(make_diff(extract, args.objects, seed=seed).encode()))
            return await call({"paths": [str(diff)], "store": live.name, "sequence": 1})

        out: dict[str, Any] = {"code": args.code or "working tree", "tiles": [], "diff": [], "scaling": []}
        try:
            # Warm-up (JIT, Parquet readers, the bus): one of each kind, not reported.
            await call({"paths": [str(tile_list(work / "warm.list", args.tiles))]})
            await diff_run(1000)
            for run in range(args.runs):
                out["tiles"].append(await call({"paths": [str(tile_list(work / f"t{run}.list", args.tiles))]}))
                out["diff"].append(await diff_run(run))
            for n in args.scaling:
                path = big_list(work / f"big-{n}.list", n)
                out["scaling"].append({"input_tiles": n, **await call({"paths": [str(path)]})})
                path.unlink()
        finally:
            await client.unit.stop()
            await bridge.close()
            await bridge_unit.stop()
            spark.stop()
        return out

    del bridge_service  # imported only so that --code is checked to shadow the working tree
    vhost = create_vhost("qbroker-bench-spark")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return asyncio.run(measure(Path(tmp), url_for_vhost(vhost)))
    finally:
        delete_vhost(vhost)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def _summary(variants: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("tiles", "diff"):
        runs = [r for v in variants for r in v[kind]]
        last = [r["seconds_to_last_expiration"] for r in runs if r["seconds_to_last_expiration"] is not None]
        out[kind] = {
            "runs": len(runs),
            "median_seconds_to_last_expiration": _median(runs, "seconds_to_last_expiration"),
            "median_seconds_to_reply": _median(runs, "seconds_to_reply"),
            "min_seconds_to_last_expiration": min(last, default=None),
            "max_seconds_to_last_expiration": max(last, default=None),
            "median_spark_jobs": _median(runs, "spark_jobs"),
        }
    scaling = [s for v in variants for s in v["scaling"]]
    if scaling:
        by_size: dict[int, list[float]] = {}
        for s in scaling:
            by_size.setdefault(s["input_tiles"], []).append(s["seconds_to_last_expiration"])
        out["scaling"] = {str(n): round(statistics.median(t), 3) for n, t in sorted(by_size.items())}
        sizes = sorted(by_size)
        out["scaling_ratios"] = {
            f"{a}->{b}": round(statistics.median(by_size[b]) / statistics.median(by_size[a]), 2)
            for a, b in zip(sizes, sizes[1:], strict=False)
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="measured runs of each kind per process")
    p.add_argument("--pairs", type=int, default=1, help="with --compare: old/new process pairs, alternating")
    p.add_argument("--tiles", type=int, default=10_000)
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument(
        "--scaling",
        type=lambda s: [int(n) for n in s.split(",") if n],
        default=[],
        help="comma-separated input sizes for the scaling runs (e.g. 1000000,10000000)",
    )
    p.add_argument(
        "--old-scaling", action="store_true", help="with --compare: run the scaling sizes on the old code too"
    )
    p.add_argument("--compare", metavar="REV", help="also run git revision REV's services/ and report ratios")
    p.add_argument("--code", help=argparse.SUPPRESS)  # child mode: a directory holding services/
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(_child(a)))
        return
    subprocess.run([str(ROOT / "bin" / "ensure-osm-data")], cwd=ROOT, capture_output=True, check=True)
    out: dict[str, Any] = {
        "benchmark": "spark bridge small jobs through the bus",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_before": os.getloadavg(),
        },
        "zooms": list(ZOOMS),
        "tiles": a.tiles,
        "objects": a.objects,
    }

    def child(code: str | None, scaling: list[int]) -> dict[str, Any]:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--runs",
            str(a.runs),
            "--tiles",
            str(a.tiles),
            "--objects",
            str(a.objects),
            "--scaling",
            ",".join(map(str, scaling)),
        ]
        if code:
            cmd += ["--code", code]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "load_avg_after": os.getloadavg()}

    new_runs: list[dict[str, Any]] = []
    old_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if a.compare:
            archive = subprocess.run(
                ["git", "archive", a.compare, "services"], cwd=ROOT, capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            out["old"] = {
                "revision": subprocess.run(
                    ["git", "rev-parse", "--short", a.compare], cwd=ROOT, capture_output=True, text=True, check=True
                ).stdout.strip()
            }
        for pair in range(a.pairs if a.compare else 1):
            if a.compare:
                old_runs.append(child(tmp, a.scaling if a.old_scaling and pair == 0 else []))
            new_runs.append(child(None, a.scaling if pair == 0 else []))
    out["new"] = {"summary": _summary(new_runs), "processes": new_runs}
    if a.compare:
        out["old"].update({"summary": _summary(old_runs), "processes": old_runs})
        ratios: dict[str, Any] = {}
        for kind in ("tiles", "diff"):
            o = out["old"]["summary"][kind]["median_seconds_to_last_expiration"]
            n = out["new"]["summary"][kind]["median_seconds_to_last_expiration"]
            ratios[kind] = round(o / n, 2) if o and n else None
        out["old_over_new"] = ratios
    out["machine"]["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
