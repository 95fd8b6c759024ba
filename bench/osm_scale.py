"""The OSM pipeline at scale: the real Helsinki extract scaled K times, imported, diffed, rendered.

For each K (``--k 1,10,50,200``): write the scaled extract (bench/osm_scale_data.py: K copies on a grid,
ids spread over the real OSM id ranges) and import it with ``toposm-import``'s code in a child process
(time, peak RSS, size on disk). Both are cached under ``--cache`` (default ``var/bench-cache/osm-scale``,
gitignored): a K=200 store takes many minutes to build, so later runs reuse it (``--rebuild`` to import
again). Each run applies its diffs to copies of them.

Then, warm (the stores' files read once into the page cache, as on a server that has been serving them;
one warm-up diff per K), one in-process Spark bridge over all the stores times the same ~1,000-object diff
(600 node moves, 300 way tag edits, 100 new nodes over all copies, none sharing a way or relation with
another in its copy; a new seed and the next sequence each run) from the ``spark.expire`` call (store,
sequence, wait) to its reply, the K's taking turns so that the machine's load falls on all of them alike,
with the job's seconds per phase. Between two diffs the bench lets the bridge's background work finish
(the sea refresh after a coastline edit) and then waits ``--gap`` seconds, as a minutely replication
leaves a minute between them. With ``--confined`` each K also takes, in the same turn, the K=1 diff's
changes confined to copy 0: the same ways, nodes and metatiles at every K, so its ratio is the store's size
alone (the spread diff expires ~2,200 metatiles at K=200 against K=1's 21). Then it renders a fixed set of
metatiles (z15-z17 over copy 0, which every K has, alone in view) from every K's store with the Mapnik
backend the renderers use. Ratios are to the first K of the same run.

    .venv/bin/python bench/osm_scale.py --k 1,10,50,200 [--runs 5] [--confined] [--cache DIR] [--rebuild]
                                        [--import-only]

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mercantile  # noqa: E402
from osm_scale_data import Scale, read_source, write_diff  # noqa: E402

from harness.broker import create_vhost, delete_vhost, url_for_vhost  # noqa: E402
from harness.osm import helsinki_extract  # noqa: E402
from qbroker import Config, Unit  # noqa: E402
from qbroker.runner import freeze_startup_heap  # noqa: E402
from services.osmstore.geometry import GeometryStore  # noqa: E402
from services.toposm.contract import SPARK_BRIDGE  # noqa: E402
from services.toposm.tilemath import Metatile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RENDER_ZOOMS = (15, 16, 17)
# The diff over all copies (the issue's), and the same changes as K=1's confined to copy 0: at every K the same
# ways and metatiles, so what differs is the store's size alone.
DIFF_COPIES: dict[str, int | None] = {"spread": None, "confined": 1}
_IMPORT = (
    "import json, sys; from pathlib import Path; from services.osmstore.importer import import_extract; "
    "print(json.dumps(import_extract(Path(sys.argv[1]), Path(sys.argv[2]))))"
)


def warm_files(store: Path) -> None:
    for f in store.rglob("*"):
        if f.is_file():
            with f.open("rb") as fh:
                while fh.read(1 << 24):
                    pass


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def import_store(extract: Path, store: Path) -> dict[str, Any]:
    """Import in a child process: its own peak RSS, nothing cached in this one."""
    shutil.rmtree(store, ignore_errors=True)
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", _IMPORT, str(extract), str(store)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"import of {extract} failed ({child.returncode})")
    info = json.loads(out)
    objects = sum(info["counts"].values())
    seconds = time.perf_counter() - started
    return {
        "nodes": info["counts"]["nodes"],
        "objects": objects,
        "import_seconds": round(seconds, 2),
        "objects_per_second": round(objects / seconds),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "store_mb": round(du(store) / 1e6, 1),
        "geometry_mb": round(du(store / "geometry") / 1e6, 1),
    }


def cached_stores(
    ks: list[int], cache: Path, rebuild: bool = False
) -> tuple[dict[int, Scale], dict[int, Path], dict[int, dict[str, Any]]]:
    """Each K's scale, imported store and import record: from ``cache`` when there, else generated and
    imported into it (the record says how long that took)."""
    extract = helsinki_extract()
    cache.mkdir(parents=True, exist_ok=True)
    src = read_source(extract)
    scales = {k: Scale(src, k) for k in ks}
    stores: dict[int, Path] = {}
    rows: dict[int, dict[str, Any]] = {}
    for k in ks:
        stores[k] = cache / f"store-x{k}"
        record = cache / f"store-x{k}.json"
        if not rebuild and record.is_file() and stores[k].is_dir():
            rows[k] = json.loads(record.read_text())
            continue
        pbf = cache / f"helsinki-x{k}.osm.pbf"
        started = time.perf_counter()
        scales[k].write_pbf(pbf)
        rows[k] = {
            "k": k,
            "generate_seconds": round(time.perf_counter() - started, 2),
            "pbf_mb": round(pbf.stat().st_size / 1e6, 1),
            "load_avg": os.getloadavg(),
        }
        rows[k].update(import_store(pbf, stores[k]))
        record.write_text(json.dumps(rows[k]))
        print(json.dumps(rows[k]), file=sys.stderr)
    return scales, stores, rows


@contextlib.asynccontextmanager
async def running_bridge(
    stores: list[Path], work: Path, url: str, driver_lookup_bytes: int | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """An in-process bridge over ``stores`` (``local[2]``, no tile limits; ``driver_lookup_bytes``: the
    bridge's ``--driver-lookup-mib``, default its own) and a client timing its calls."""
    # Imported here: generating and importing (--import-only) needs no Spark.
    from osm_expire import TimedExpire

    from services.spark_bridge.limits import BridgeLimits
    from services.spark_bridge.service import SparkBridge
    from services.spark_bridge.spark_session import build_session
    from services.spark_bridge.store_lookup import DRIVER_LOOKUP_BYTES

    spark = build_session(
        "local[2]", "bench-osm-scale", {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    bridge_unit = Unit(SPARK_BRIDGE, config=Config(url=url))
    client = TimedExpire(url)
    bridge = SparkBridge(
        bridge_unit,
        spark,
        work / "state",
        max_jobs=1,
        input_roots=[work],
        stores=stores,
        limits=BridgeLimits(max_tiles=10**9, max_tiles_per_geometry=10**9),
        driver_lookup_bytes=DRIVER_LOOKUP_BYTES if driver_lookup_bytes is None else driver_lookup_bytes,
    )
    await bridge_unit.start()
    await client.unit.start()
    freeze_startup_heap()  # as qbroker.serve does once a service has started
    try:
        yield bridge, client
    finally:
        await client.unit.stop()
        await bridge.close()
        await bridge_unit.stop()
        spark.stop()


async def timed_diff(
    bridge: Any, client: Any, store: Path, scale: Scale, work: Path, weight: int = 1, copies: int | None = None
) -> dict[str, Any]:
    """The store's next diff (``weight`` x ~1,000 objects, over the first ``copies`` copies, default all) from
    the call to its reply, then the bridge's background work after it (the sea refresh) waited for."""
    sequence = (GeometryStore.of_store(store).sequence or 0) + 1
    diff = write_diff(scale, sequence, work / f"diff-{store.name}-{sequence}.osc.gz", weight, copies)
    load = os.getloadavg()[0]
    reply, last, to_reply = await client.call(
        {"paths": [str(diff)], "store": store.name, "sequence": sequence, "min_zoom": 10, "max_zoom": 18}, settle=60
    )
    result = reply["result"]
    assert result["store"].get("applied"), result["store"]
    started = time.perf_counter()
    await asyncio.to_thread(bridge.stores.sea[store.resolve()].wait_idle)
    background = time.perf_counter() - started
    return {
        "seconds_to_reply": round(to_reply, 3),
        "seconds_to_last_expiration": None if last is None else round(last, 3),
        "load_avg_1min": round(load, 2),
        "objects": result["inputs"]["osc_nodes"] + result["inputs"]["osc_ways"],
        "ways_expired": result["inputs"]["ways"],
        "tiles": result["total_tiles"],
        "metatiles": result["total_metatiles"],
        "metatiles_per_zoom": result["metatiles_per_zoom"],
        "phase_seconds": result.get("phase_seconds"),
        "render_store": {
            name: v
            for name, v in result["store"].get("render", {}).items()
            if name.startswith(("prepare", "features_")) or name == "ways_rebuilt"
        },
        "sea_stale": bool(result["store"].get("render", {}).get("sea_stale")),
        "sea_refresh_seconds_after_reply": round(background, 3),
    }


async def time_diffs(
    stores: dict[int, Path],
    scales: dict[int, Scale],
    work: Path,
    runs: int,
    gap: float,
    url: str,
    confined: bool = False,
) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Per (K, "spread" or "confined"), the timed diffs: with ``confined``, each K also takes the K=1 diff's
    changes in copy 0 (DIFF_COPIES), after its spread diff in the same turn."""
    variants = DIFF_COPIES if confined else {"spread": None}
    out: dict[tuple[int, str], list[dict[str, Any]]] = {(k, v): [] for k in stores for v in variants}
    async with running_bridge(list(stores.values()), work, url) as (bridge, client):
        for run in range(runs + 1):  # run 0 warms the session and each store's files; not reported
            for k, store in stores.items():
                for variant, copies in variants.items():
                    row = await timed_diff(bridge, client, store, scales[k], work, copies=copies)
                    if run:
                        out[(k, variant)].append(row)
                    await asyncio.sleep(gap)
    return out


def render_metatiles(
    stores: dict[int, Path],
    scale: Scale,
    passes: int = 4,
    zooms: tuple[int, ...] = RENDER_ZOOMS,
    box: tuple[float, float, float, float] | None = None,
) -> dict[int, dict[str, Any]]:
    """Seconds per metatile (median over every pass but the first, and per zoom) for the metatiles covering
    ``box`` (default copy 0) at ``zooms``, from every store, the stores taking turns metatile by metatile (the
    load falls on all)."""
    from services.tiles.renderer.backends.mapnik_backend import MapnikBackend

    w, s, e, n = box or scale.src.box  # copy 0 is where it is in the extract, at every K
    metatiles = sorted({Metatile(z, t.x >> 3, t.y >> 3) for z in zooms for t in mercantile.tiles(w, s, e, n, z)})
    backends = {k: MapnikBackend(store=store) for k, store in stores.items()}
    timings: dict[int, list[tuple[int, float]]] = {k: [] for k in stores}
    for done in range(passes):  # the first pass loads the styles and warms the page cache: not counted
        for mt in metatiles:
            for k, backend in backends.items():
                started = time.perf_counter()
                backend.render(mt)
                if done:
                    timings[k].append((mt.z, time.perf_counter() - started))
    return {
        k: {
            "metatiles": [str(m) for m in metatiles],
            "renders": len(t),
            "median_seconds": round(statistics.median(s for _, s in t), 4),
            "median_seconds_per_zoom": {
                z: round(statistics.median(s for tz, s in t if tz == z), 4) for z in sorted({tz for tz, _ in t})
            },
            "total_seconds": round(sum(s for _, s in t), 3),
        }
        for k, t in timings.items()
    }


def _phase_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    phases = sorted({name for r in runs for name in (r["phase_seconds"] or {})})
    return {
        name: round(statistics.median((r["phase_seconds"] or {}).get(name, 0.0) for r in runs), 3) for name in phases
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", default="1,10,50,200", help="scale factors, comma-separated (the first is the baseline)")
    p.add_argument("--runs", type=int, default=5, help="timed diffs per K (after one warm-up each)")
    p.add_argument("--gap", type=float, default=3.0, help="seconds between two diffs, once the bridge is idle")
    p.add_argument(
        "--cache",
        type=Path,
        default=ROOT / "var" / "bench-cache" / "osm-scale",
        help="where the extracts and stores are kept between runs",
    )
    p.add_argument("--rebuild", action="store_true", help="import the stores again even if cached")
    p.add_argument("--import-only", action="store_true", help="generate and import what is not cached, then stop")
    p.add_argument(
        "--confined",
        action="store_true",
        help="also time, at every K, the K=1 diff's changes confined to copy 0 (the store's size alone)",
    )
    a = p.parse_args()
    ks = [int(v) for v in a.k.split(",")]
    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_before": os.getloadavg(),
        }
    }
    cache = a.cache.resolve()
    scales, stores, rows = cached_stores(ks, cache, a.rebuild)
    if a.import_only:
        print(json.dumps({"sizes": [rows[k] for k in ks]}, indent=2))
        return
    work = Path(tempfile.mkdtemp(prefix="osm-scale-", dir=cache))  # this run's stores, diffs and bridge state
    vhost = create_vhost("qbroker-bench")
    try:
        # The diffs go to copies, so every run starts from the imported stores (the same diffs, sequences
        # 1001...) and renders come from stores no diff has touched (the bench's node moves leave some
        # multipolygons invalid, so a store K=1 that took many diffs draws less than the imported one).
        live = {k: work / stores[k].name for k in ks}
        for k in ks:
            shutil.copytree(stores[k], live[k])
            warm_files(live[k])  # warm: in the page cache, as on a server that has been serving the store
        diffs = asyncio.run(time_diffs(live, scales, work, a.runs, a.gap, url_for_vhost(vhost), a.confined))
        out["machine"]["load_avg_after_diffs"] = os.getloadavg()
        for variant in sorted({v for _, v in diffs}):
            prefix = "" if variant == "spread" else f"{variant}_"
            base = statistics.median(r["seconds_to_reply"] for r in diffs[(ks[0], variant)])
            for k in ks:
                runs = diffs[(k, variant)]
                median = statistics.median(r["seconds_to_reply"] for r in runs)
                rows[k].update(
                    {
                        f"{prefix}diff_seconds_median": round(median, 3),
                        f"{prefix}diff_seconds": [r["seconds_to_reply"] for r in runs],
                        f"{prefix}diff_ratio_to_first": round(median / base, 2),
                        f"{prefix}diff_phase_medians": _phase_medians(runs),
                        f"{prefix}diff_runs": runs,
                    }
                )
        renders = render_metatiles(stores, scales[ks[0]])
        out["render"] = {str(k): r for k, r in renders.items()}
        for k in ks:
            rows[k]["render_seconds_per_metatile"] = renders[k]["median_seconds"]
            rows[k]["render_ratio_to_first"] = round(renders[k]["median_seconds"] / renders[ks[0]]["median_seconds"], 2)
    finally:
        delete_vhost(vhost)
        shutil.rmtree(work, ignore_errors=True)
    out["sizes"] = [rows[k] for k in ks]
    out["machine"]["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
