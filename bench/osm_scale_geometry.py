"""The geometry store alone at scale: build it from the scaled extracts (no rendering store) and time the
benchmark diff's resolution (the three lookups, on the driver) and its commit, per K.

This is the part of a store diff that used to grow with the store (the copy-on-write Parquet rewrite and
the partition reads); bench/osm_scale.py times the whole job through the bridge. Ratios are to
the first K of the same run; each K gets ``--runs`` diffs after one warm-up.

With ``--before REF`` each diff is also resolved by the resolution as it was at git revision REF
(``services/spark_bridge/store_expire.py`` there, against today's store), under the same lock, the two
taking turns which goes first: ``ratio_to_before`` is today's resolution over REF's, per diff, median of
the runs, in wall time and (``cpu_ratio_to_before``) in the process's CPU time, which a loaded machine's
waits for a core do not count (what a change to the resolution costs, on the same diffs and stores, in
the same run). With ``--keep`` the geometry stores in ``--work`` are reused when they are of today's format
(a K=200 build takes minutes); the diffs then go on from the sequence they reached.

    .venv/bin/python bench/osm_scale_geometry.py --k 1,50,200 [--runs 5] [--work DIR] [--before REF] [--keep]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from osm_scale_data import Scale, read_source, write_diff  # noqa: E402

from harness.osm import helsinki_extract  # noqa: E402
from services.osmstore import render_db  # noqa: E402
from services.osmstore.geometry import FORMAT_VERSION, GEOMETRY_DIR, GeometryStore, GeometryStoreError  # noqa: E402
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


Resolve = Callable[..., Any]


def resolution_at(ref: str, work: Path) -> Resolve:
    """``resolve`` as git revision ``ref`` has it (its store_expire.py, imported from a copy in ``work``)."""
    source = subprocess.run(
        ["git", "show", f"{ref}:services/spark_bridge/store_expire.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = work / f"store_expire_at_{ref.replace('/', '_')}.py"
    path.write_text(source)
    spec = spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = module_from_spec(spec)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.resolve  # type: ignore[no-any-return]


def time_diff(
    store: Path, scale: Scale, work: Path, before: Resolve | None = None, before_first: bool = False
) -> dict[str, float]:
    geometry = GeometryStore.of_store(store)
    with geometry.locked() as manifest:
        sequence = (manifest.sequence or 0) + 1
        diff = read_diff(write_diff(scale, sequence, work / f"g-{scale.k}-{sequence}.osc.gz"))
        out: dict[str, float] = {}
        if before is not None and before_first:
            out.update(_resolve_timed(before, diff, geometry, manifest, "before_"))
        started, cpu = time.perf_counter(), time.process_time()
        # Driver lookups only (the default budget): no Spark session is needed for them.
        resolution = resolve(None, diff, geometry, manifest, 18)  # type: ignore[arg-type]
        resolved, cpu = time.perf_counter(), time.process_time() - cpu
        if before is not None and not before_first:
            out.update(_resolve_timed(before, diff, geometry, manifest, "before_"))
        committing = time.perf_counter()
        apply_locked(geometry, manifest, diff, sequence)
        done = time.perf_counter()
    out.update(
        {
            "resolve": round(resolved - started, 4),
            "resolve_cpu": round(cpu, 4),
            "commit": round(done - committing, 4),
            "total": round(resolved - started + done - committing, 4),
            "ways": resolution.counts["ways"],
            "parent_relations": resolution.counts.get("parent_relations", 0),
            "segments": resolution.segments.num_rows,
        }
    )
    if before is not None:
        out["ratio_to_before"] = round(out["resolve"] / out["before_resolve"], 3)
        out["cpu_ratio_to_before"] = round(out["resolve_cpu"] / out["before_resolve_cpu"], 3)
    return out


def _resolve_timed(fn: Resolve, diff: Any, geometry: GeometryStore, manifest: Any, prefix: str) -> dict[str, float]:
    started, cpu = time.perf_counter(), time.process_time()
    resolution = fn(None, diff, geometry, manifest, 18)
    return {
        f"{prefix}resolve": round(time.perf_counter() - started, 4),
        f"{prefix}resolve_cpu": round(time.process_time() - cpu, 4),
        f"{prefix}ways": resolution.counts["ways"],
        f"{prefix}segments": resolution.segments.num_rows,
    }


def reusable(store: Path) -> bool:
    with suppress(GeometryStoreError):
        return GeometryStore.of_store(store).manifest().format_version == FORMAT_VERSION
    return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", default="1,50,200")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--work", type=Path)
    p.add_argument("--before", help="a git revision whose resolution each diff is also timed with")
    p.add_argument("--keep", action="store_true", help="reuse the geometry stores in --work (today's format)")
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
        seconds = 0.0 if a.keep and reusable(stores[k]) else build(pbf, stores[k])
        db = stores[k] / GEOMETRY_DIR / "geometry.sqlite"
        rows[k] = {
            "k": k,
            "nodes": GeometryStore.of_store(stores[k]).manifest().counts["nodes"],
            "build_seconds": round(seconds, 1),
            "geometry_mb": round(db.stat().st_size / 1e6, 1),
            "runs": [],
        }
        print(json.dumps({x: v for x, v in rows[k].items() if x != "runs"}), file=sys.stderr)
    before = resolution_at(a.before, work) if a.before else None
    for run in range(a.runs + 1):  # the K's take turns; run 0 warms up
        for k in ks:
            timing = time_diff(stores[k], scales[k], work, before, before_first=run % 2 == 1)
            if run:
                rows[k]["runs"].append(timing)
                print(json.dumps({"k": k, **timing}), file=sys.stderr)
    base = statistics.median(r["total"] for r in rows[ks[0]]["runs"])
    for k in ks:
        median = statistics.median(r["total"] for r in rows[k]["runs"])
        rows[k].update(
            median_seconds=round(median, 4),
            ratio_to_first=round(median / base, 2),
            median_resolve=round(statistics.median(r["resolve"] for r in rows[k]["runs"]), 4),
            median_commit=round(statistics.median(r["commit"] for r in rows[k]["runs"]), 4),
        )
        if before is not None:
            runs = rows[k]["runs"]
            rows[k].update(
                before=a.before,
                median_before_resolve=round(statistics.median(r["before_resolve"] for r in runs), 4),
                median_ratio_to_before=round(statistics.median(r["ratio_to_before"] for r in runs), 3),
                median_resolve_cpu=round(statistics.median(r["resolve_cpu"] for r in runs), 4),
                median_before_resolve_cpu=round(statistics.median(r["before_resolve_cpu"] for r in runs), 4),
                median_cpu_ratio_to_before=round(statistics.median(r["cpu_ratio_to_before"] for r in runs), 3),
            )
    print(json.dumps({"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "sizes": [rows[k] for k in ks]}, indent=2))


if __name__ == "__main__":
    main()
