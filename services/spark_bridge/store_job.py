"""The expiry job against a store: resolve the diff in Spark, update both stores, publish, commit.

Order matters, and is chosen so that a crash anywhere leaves something the next run repairs:

1. under the geometry store's writer lock, check the sequence (a replay changes nothing; a gap fails);
2. resolve the diff against the *old* geometry (Spark) and aggregate the metatiles (cached);
3. apply the diff to the rendering store (one SQLite transaction, recording the sequence), so tiles
   rendered from now on show the edit;
4. publish the expirations (the queuemaster re-renders from the updated rendering store);
5. commit the diff to the geometry store (new snapshot, atomic ``CURRENT`` swap) with its sequence.

A failure before 5 leaves the geometry store at the previous sequence: running the diff again repeats
the expiry (recomputed from the old geometry) and skips the rendering store, which recognises the
sequence. Duplicated expirations only cost a re-render; a missed one would leave a stale tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from services.osmstore.geometry import GeometryStore
from services.osmstore.geometry_apply import apply_locked, check_sequence
from services.osmstore.osc_diff import read_diff
from services.osmstore.render_db import RENDER_DB
from services.osmstore.render_store import apply_osc
from services.spark_bridge.expire_job import (
    ExpireParams,
    buffered_tiles,
    metatile_counts,
    propagate,
    way_samples,
)
from services.spark_bridge.expire_job import _publish as publish_metatiles  # the one publisher of expirations
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.store_expire import check_geometry_cap, resolve
from services.spark_bridge.tilemath import frac_tile_x, frac_tile_y
from services.spark_bridge.way_segments import ExpireTooLarge


@dataclass(frozen=True)
class StoreJob:
    store_dir: Path
    sequence: int | None
    apply: bool  # false: expire against the store without changing it (a dry run, benchmarks)


def _base_tiles(points: DataFrame, segments: DataFrame, zoom: int) -> DataFrame:
    fracs = points.select(frac_tile_x(points["lon"], zoom).alias("fx"), frac_tile_y(points["lat"], zoom).alias("fy"))
    return buffered_tiles(fracs.unionByName(way_samples(segments, zoom)), zoom)


def run_store_expire(osc_path: Path, job: StoreJob, params: ExpireParams, ctx: JobContext) -> dict[str, Any]:
    ctx.set_phase("reading")
    diff = read_diff(osc_path)
    ctx.count("osc_nodes", len(diff.nodes))
    ctx.count("osc_ways", len(diff.ways))
    ctx.count("osc_relations", len(diff.relations))
    geometry = GeometryStore.of_store(job.store_dir)
    render_db = job.store_dir / RENDER_DB
    out: dict[str, Any] = {"min_zoom": params.min_zoom, "max_zoom": params.max_zoom, "tiles_per_zoom": {},
                           "metatiles_per_zoom": {}, "total_tiles": 0, "total_metatiles": 0,
                           "published": {"messages": 0, "metatiles": 0}}
    with geometry.locked() as manifest:
        replay = check_sequence(manifest, job.sequence, diff.sha256)
        if replay is not None:
            ctx.log(f"replay: {replay.reason}")
            out["store"] = {"applied": False, "replay": replay.reason, "sequence": manifest.sequence}
            out["inputs"] = dict(ctx.counters)
            return out
        ctx.set_phase("resolving")
        resolution = resolve(ctx.spark, diff, geometry, manifest, params.max_zoom)
        try:
            for name, value in resolution.counts.items():
                ctx.count(name, value)
            ctx.check_cancelled()
            check_geometry_cap(resolution.counts, params.max_zoom, params.max_tiles_per_geometry)
            ctx.set_phase("expiring")
            base = _base_tiles(resolution.points, resolution.segments, params.max_zoom)
            metas = metatile_counts(propagate(base, params.min_zoom)).persist()
            try:
                _summarise(metas, params, ctx, out)
                store_out: dict[str, Any] = {"applied": False, "sequence": manifest.sequence}
                if job.apply and render_db.is_file():
                    ctx.set_phase("rendering store")
                    store_out["render"] = apply_osc(job.store_dir, osc_path, sequence=job.sequence,
                                                    sha256=diff.sha256)
                if params.publish and ctx.publish is not None:
                    ctx.set_phase("publishing")
                    out["published"] = publish_metatiles(metas, params, ctx)
            finally:
                metas.unpersist()
        finally:
            resolution.release()
        if job.apply:
            ctx.set_phase("geometry store")
            applied = apply_locked(geometry, manifest, diff, job.sequence)
            store_out.update(applied)
        out["store"] = store_out
    out["inputs"] = {k: v for k, v in ctx.counters.items() if k not in ("tiles", "metatiles", "published")}
    return out


def _summarise(metas: DataFrame, params: ExpireParams, ctx: JobContext, out: dict[str, Any]) -> None:
    summary = metas.groupBy("z").agg(F.sum("tiles").alias("tiles"), F.count(F.lit(1)).alias("metas"))
    for row in sorted(summary.collect(), key=lambda r: r["z"]):
        out["tiles_per_zoom"][str(row["z"])] = int(row["tiles"])
        out["metatiles_per_zoom"][str(row["z"])] = int(row["metas"])
    out["total_tiles"] = sum(out["tiles_per_zoom"].values())
    out["total_metatiles"] = sum(out["metatiles_per_zoom"].values())
    ctx.count("tiles", out["total_tiles"])
    ctx.count("metatiles", out["total_metatiles"])
    if out["total_tiles"] > params.max_tiles:
        raise ExpireTooLarge(f"{out['total_tiles']} expired tiles exceed max_tiles={params.max_tiles}")
