"""The geometry store alone at scale: build it from the scaled extracts (no rendering store) and time the
benchmark diff's resolution (the three lookups, on the driver) and its commit, per K.

This is the part of a store diff that used to grow with the store (the copy-on-write Parquet rewrite and
the partition reads); bench/osm_scale.py times the whole job through the bridge. Ratios are to
the first K of the same run; each K gets ``--runs`` diffs after one warm-up.

    .venv/bin/python bench/osm_scale_geometry.py --k 1,50,200 [--runs 5] [--work DIR]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from osm_scale_data import Scale, read_source, write_diff  # noqa: E402

from harness.osm import helsinki_extract  # noqa: E402
from services.osmstore import render_db  # noqa: E402
from services.osmstore.geometry import GEOMETRY_DIR, GeometryStore  # noqa: E402
from services.osmstore.geometry_apply import apply_locked  # noqa: E402
from services.osmstore.geometry_import import build_geometry_store  # noqa: E402
from services.osmstore.import_pass import read_extract  # noqa: E402
from services.osmstore.osc_diff import read_diff  # noqa: E402
from services.osmstore.render_cluster import BulkFeatureWriter  # noqa: E402
from services.spark_bridge.store_expire import resolve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def build(pbf: Path, store: Path) -> float:
    """The geometry store as toposm-import builds it (the import's pass, its rendering features thrown away)."""
    shutil.rmtree(store, ignore_errors=True)
    started = time.perf_counter()
    features = sqlite3.connect(":memory:")
    render_db.create_schema(features)
    scan = read_extract(pbf, store / ".scratch", BulkFeatureWriter(features))
    build_geometry_store(store / GEOMETRY_DIR, scan.locations.path, scan.locations.count, scan.objects, 1000)
    shutil.rmtree(store / ".scratch")
    return time.perf_counter() - started


def time_diff(store: Path, scale: Scale, work: Path) -> dict[str, float]:
    geometry = GeometryStore.of_store(store)
    with geometry.locked() as manifest:
        sequence = (manifest.sequence or 0) + 1
        diff = read_diff(write_diff(scale, sequence, work / f"g-{scale.k}-{sequence}.osc.gz"))
        started = time.perf_counter()
        # Driver lookups only (the default budget): no Spark session is needed for them.
        resolution = resolve(None, diff, geometry, manifest, 18)  # type: ignore[arg-type]
        resolved = time.perf_counter()
        apply_locked(geometry, manifest, diff, sequence)
        done = time.perf_counter()
    return {"resolve": round(resolved - started, 4), "commit": round(done - resolved, 4),
            "total": round(done - started, 4), "ways": resolution.counts["ways"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", default="1,50,200")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--work", type=Path)
    a = p.parse_args()
    ks = [int(v) for v in a.k.split(",")]
    extract = helsinki_extract()
    work = a.work or Path(tempfile.mkdtemp(prefix="osm-scale-geometry-"))
    work.mkdir(parents=True, exist_ok=True)
    src = read_source(extract)
    rows: dict[int, dict[str, Any]] = {}
    stores: dict[int, Path] = {}
    scales = {k: Scale(src, k) for k in ks}
    for k in ks:
        pbf = work / f"helsinki-x{k}.osm.pbf"
        if not pbf.is_file():
            scales[k].write_pbf(pbf)
        stores[k] = work / f"geometry-x{k}"
        seconds = build(pbf, stores[k])
        db = stores[k] / GEOMETRY_DIR / "geometry.sqlite"
        rows[k] = {"k": k, "nodes": GeometryStore.of_store(stores[k]).manifest().counts["nodes"],
                   "build_seconds": round(seconds, 1), "geometry_mb": round(db.stat().st_size / 1e6, 1), "runs": []}
        print(json.dumps({x: v for x, v in rows[k].items() if x != "runs"}), file=sys.stderr)
    for run in range(a.runs + 1):  # the K's take turns; run 0 warms up
        for k in ks:
            timing = time_diff(stores[k], scales[k], work)
            if run:
                rows[k]["runs"].append(timing)
    base = statistics.median(r["total"] for r in rows[ks[0]]["runs"])
    for k in ks:
        median = statistics.median(r["total"] for r in rows[k]["runs"])
        rows[k].update(median_seconds=round(median, 4), ratio_to_first=round(median / base, 2),
                       median_resolve=round(statistics.median(r["resolve"] for r in rows[k]["runs"]), 4),
                       median_commit=round(statistics.median(r["commit"] for r in rows[k]["runs"]), 4))
    print(json.dumps({"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "sizes": [rows[k] for k in ks]}, indent=2))


if __name__ == "__main__":
    main()
