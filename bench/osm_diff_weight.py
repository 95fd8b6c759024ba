"""How a diff's cost grows with the diff's weight: one scaled store, diffs of 1,000 to 50,000 objects.

bench/osm_scale.py holds the diff fixed (~1,000 objects) and grows the store; this holds the store fixed and
grows the diff, as a planet's minutely diffs (thousands to tens of thousands of objects) and a follower
catching up several of them in one merged job (``toposm-replicate --batch``) do. One store of the scaled
Helsinki extract (``--k``, default 50; bench/osm_scale.py's, cached in the same place, built on the first
run) is copied and read once (warm); one in-process bridge (``local[2]``) applies diffs of each weight
(``--diff-objects``, multiples of 1,000: bench/osm_scale_data.py's mix of node moves, way edits and new
nodes W times over, spread over all copies as W one-minute diffs merged would be), the weights taking
turns on the one store (order reversed every run), each timed from the ``spark.expire`` call (store,
sequence, wait) to its reply, with the tiles and metatiles it expired (zooms 10-18) and its phases. A
least-squares line through every timed diff gives the fixed cost of a diff and the seconds per 1,000
changed objects. Then (``--render-zooms``, default 10-14) it renders every metatile over the whole grid
of copies at those zooms from the imported store, with the renderers' Mapnik backend (one warm-up pass,
one timed): what a low-zoom metatile costs when it holds many cities, beside bench/osm_scale.py's
z15-17 metatiles over one city.

    .venv/bin/python bench/osm_diff_weight.py [--k 50] [--diff-objects 1000,10000,50000] [--runs 3] \
        [--render-zooms 10-14]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from osm_scale import ROOT, cached_stores, render_metatiles, running_bridge, timed_diff, warm_files  # noqa: E402
from osm_scale_data import Scale  # noqa: E402

from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402


async def time_weights(
    store: Path,
    scale: Scale,
    weights: list[int],
    work: Path,
    runs: int,
    gap: float,
    url: str,
    driver_lookup_bytes: int | None,
) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {w: [] for w in weights}
    async with running_bridge([store], work, url, driver_lookup_bytes) as (bridge, client):
        for run in range(runs + 1):  # run 0 warms the session and the store's files; not reported
            for weight in weights if run % 2 == 0 else weights[::-1]:
                row = await timed_diff(bridge, client, store, scale, work, weight)
                print(
                    json.dumps(
                        {
                            "run": run,
                            "weight": weight,
                            **{k: row[k] for k in ("seconds_to_reply", "objects", "metatiles", "load_avg_1min")},
                        }
                    ),
                    file=sys.stderr,
                )
                if run:
                    out[weight].append(row)
                await asyncio.sleep(gap)
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    phases = sorted({name for r in runs for name in (r["phase_seconds"] or {})})
    zooms = sorted({z for r in runs for z in r["metatiles_per_zoom"]}, key=int)
    return {
        "objects": round(median("objects")),
        "seconds_to_reply_median": round(median("seconds_to_reply"), 3),
        "seconds_to_reply": [r["seconds_to_reply"] for r in runs],
        "load_avg_1min": [r["load_avg_1min"] for r in runs],
        "ways_expired": round(median("ways_expired")),
        "tiles": round(median("tiles")),
        "metatiles": round(median("metatiles")),
        "metatiles_per_zoom": {
            z: round(statistics.median(r["metatiles_per_zoom"].get(z, 0) for r in runs)) for z in zooms
        },
        "phase_medians": {
            name: round(statistics.median((r["phase_seconds"] or {}).get(name, 0.0) for r in runs), 3)
            for name in phases
        },
        "rendering_store_cpu_median": round(
            statistics.median(r["render_store"].get("prepare_cpu_seconds", 0.0) for r in runs), 3
        ),
    }


def fit(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    """``key`` = intercept + slope x objects over every run (least squares), slope per 1,000 objects."""
    slope, intercept = statistics.linear_regression([r["objects"] for r in runs], [r[key] for r in runs])
    return {"per_1000_objects": round(slope * 1000, 4), "intercept": round(intercept, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=50, help="the store: K copies of the extract (default 50)")
    p.add_argument(
        "--diff-objects",
        default="1000,10000,50000",
        help="diff weights, comma-separated, multiples of 1,000 (at most 1,000 x K)",
    )
    p.add_argument("--runs", type=int, default=3, help="timed diffs per weight (after one warm-up each)")
    p.add_argument("--gap", type=float, default=3.0, help="seconds between two diffs, once the bridge is idle")
    p.add_argument(
        "--cache",
        type=Path,
        default=ROOT / "var" / "bench-cache" / "osm-scale",
        help="where the extracts and stores are kept between runs (bench/osm_scale.py's)",
    )
    p.add_argument(
        "--render-zooms", default="10-14", help="zooms rendered over the whole grid (ZMIN-ZMAX; '' for none)"
    )
    p.add_argument(
        "--driver-lookup-mib",
        type=float,
        default=None,
        help="the bridge's driver budget for lookups and tile math (default: the bridge's own, 64)",
    )
    a = p.parse_args()
    objects = [int(v) for v in a.diff_objects.split(",")]
    if any(n % 1000 or n < 1000 for n in objects):
        raise SystemExit("--diff-objects: multiples of 1000")
    weights = [n // 1000 for n in objects]
    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_before": os.getloadavg(),
        },
        "k": a.k,
        "runs": a.runs,
        "gap": a.gap,
        "driver_lookup_mib": a.driver_lookup_mib,
    }
    scales, stores, rows = cached_stores([a.k], a.cache.resolve())
    out["store"] = rows[a.k]
    work = Path(tempfile.mkdtemp(prefix="osm-diff-weight-", dir=a.cache.resolve()))
    vhost = create_vhost("qbroker-bench")
    try:
        live = work / stores[a.k].name
        shutil.copytree(stores[a.k], live)
        warm_files(live)  # warm: in the page cache, as on a server that has been serving the store
        budget = None if a.driver_lookup_mib is None else int(a.driver_lookup_mib * (1 << 20))
        timed = asyncio.run(time_weights(live, scales[a.k], weights, work, a.runs, a.gap, url_for_vhost(vhost), budget))
    finally:
        delete_vhost(vhost)
        shutil.rmtree(work, ignore_errors=True)
    every = [r for w in weights for r in timed[w]]
    out["weights"] = {str(w * 1000): {**summary(timed[w]), "runs": timed[w]} for w in weights}
    out["slope"] = {
        "seconds_to_reply": fit(every, "seconds_to_reply"),
        "metatiles": fit(every, "metatiles"),
        "tiles": fit(every, "tiles"),
    }
    if a.render_zooms:
        low, high = (int(v) for v in a.render_zooms.split("-"))
        out["machine"]["load_avg_before_renders"] = os.getloadavg()
        out["render"] = render_metatiles(
            {a.k: stores[a.k]}, scales[a.k], passes=2, zooms=tuple(range(low, high + 1)), box=scales[a.k].box()
        )[a.k]
        out["render"]["metatiles_per_zoom"] = {
            z: sum(1 for m in out["render"]["metatiles"] if m.startswith(f"{z}/")) for z in range(low, high + 1)
        }
        del out["render"]["metatiles"]
    out["machine"]["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
