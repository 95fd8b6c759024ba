"""The expiry job against a store: resolve the diff in Spark, update both stores, publish, commit.

Order matters, and is chosen so that a crash anywhere leaves something the next run repairs:

1. under the geometry store's writer lock, check the sequence (a replay changes nothing; a gap fails);
2. resolve the diff against the *old* geometry (three lookups by id) and aggregate the metatiles: each
   on the driver when it is small (a minutely diff), else in Spark (store_lookup, expire_local);
3. apply the diff to the rendering store (one SQLite transaction, recording the sequence), so tiles
   rendered from now on show the edit. The transaction is built by a kept worker process while step 2
   runs and committed only after it succeeded and the guards passed (render_apply);
4. publish the expirations (the queuemaster re-renders from the updated rendering store);
5. commit the diff to the geometry store (one SQLite transaction, the sequence with the rows; written
   while the rendering store's transaction is being built, committed only now);
6. after a diff that changed the coastline, rebuild the sea in the background and publish the diff's
   expirations again (sea_refresh).

A failure before 5 leaves the geometry store at the previous sequence: running the diff again repeats
the expiry (recomputed from the old geometry) and skips the rendering store, which recognises the
sequence. Duplicated expirations only cost a re-render; a missed one would leave a stale tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from services.osmstore.geometry import GeometryStore, SequenceGap
from services.osmstore.geometry_apply import PreparedDiff, check_sequence
from services.osmstore.osc_diff import OscDiff, file_sha256, read_diff
from services.osmstore.render_db import RENDER_DB
from services.spark_bridge import expire_local
from services.spark_bridge.expire_collect import Collected, collect, metatile_rows
from services.spark_bridge.expire_job import (
    ExpireParams,
    buffered_tiles,
    expired_metatiles,
    publish,
    summarise,
    way_samples,
)
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.render_apply import RenderApply
from services.spark_bridge.sea_refresh import SeaRefresher
from services.spark_bridge.store_expire import check_geometry_cap, resolve
from services.spark_bridge.store_lookup import DRIVER_LOOKUP_BYTES


@dataclass(frozen=True)
class StoreJob:
    store_dir: Path
    sequence: int | None
    apply: bool  # false: expire against the store without changing it (a dry run, benchmarks)
    # Estimated bytes one step (a lookup, the tile math) may hold on the driver; more goes to Spark
    # (store_lookup, expire_local).
    driver_lookup_bytes: int = DRIVER_LOOKUP_BYTES
    first_sequence: int | None = None  # a merged diff of first_sequence..sequence (toposm-replicate catching up)
    # The bridge's own (Stores: its writer kept open across jobs); None: the job opens the store itself.
    geometry: GeometryStore | None = field(default=None, compare=False)
    # Rebuilds the sea after a diff that changed the coastline (sea_refresh); None: the sea stays stale.
    sea: SeaRefresher | None = field(default=None, compare=False)


def base_tiles(segments: DataFrame, zoom: int) -> DataFrame:
    return buffered_tiles(way_samples(segments, zoom), zoom)


def _count_diff(diff: OscDiff, ctx: JobContext) -> None:
    ctx.count("osc_nodes", len(diff.nodes))
    ctx.count("osc_ways", len(diff.ways))
    ctx.count("osc_relations", len(diff.relations))


def segments_frame(spark: SparkSession, segments: pa.Table) -> DataFrame:
    # An empty Arrow table has no rows to infer from under Spark Connect: its schema is spelt out.
    if segments.num_rows:
        return spark.createDataFrame(segments)
    return spark.createDataFrame([], "lon0 double, lat0 double, lon1 double, lat1 double")


def _expire(segments: pa.Table, params: ExpireParams, job: StoreJob, ctx: JobContext) -> Collected:
    """The metatiles of the resolved segments: on the driver when they fit its budget (expire_local), else
    Spark's plan."""
    if expire_local.estimated_bytes(segments, params.max_zoom) <= job.driver_lookup_bytes:
        return expire_local.expire_on_driver(segments, params.min_zoom, params.max_zoom)
    ctx.count("spark_expiry", 1)
    frame = segments_frame(ctx.spark, segments)
    # The general plan (None: size not known up front): the single-exchange one for small jobs was
    # no faster here, a diff's samples pile up in few tiles and want the map-side dedupe.
    return collect([metatile_rows(expired_metatiles(base_tiles(frame, params.max_zoom), params, None))])


def run_store_expire(
    osc_path: Path, job: StoreJob, params: ExpireParams, ctx: JobContext, name: str | None = None
) -> dict[str, Any]:
    """``name``: the diff as the caller gave it, what errors say (default its path)."""
    ctx.set_phase("reading")

    def read(path: Path) -> OscDiff:
        return read_diff(path, name=name, limits=params.input_limits, check=ctx.reading)

    geometry = job.geometry or GeometryStore.of_store(job.store_dir)
    render_db = job.store_dir / RENDER_DB
    out: dict[str, Any] = {
        "min_zoom": params.min_zoom,
        "max_zoom": params.max_zoom,
        "tiles_per_zoom": {},
        "metatiles_per_zoom": {},
        "total_tiles": 0,
        "total_metatiles": 0,
        "published": {"messages": 0, "metatiles": 0},
    }
    # The sequence check needs only the file's digest, so the rendering store's child (the longest part
    # of a store job once the lookups are on the driver; docs/performance.md, "The Spark bridge") starts
    # before the diff is parsed here, not after.
    try:
        sha256 = file_sha256(osc_path)
    except OSError:
        read(osc_path)  # the same UnreadableOsc as ever for a file that is gone or unreadable
        raise
    with geometry.locked() as manifest:
        try:
            replay = check_sequence(manifest, job.sequence, sha256, first=job.first_sequence)
        except SequenceGap:
            read(osc_path)  # an unreadable diff is reported as such before any sequence problem
            raise
        if replay is not None:
            _count_diff(read(osc_path), ctx)
            ctx.log(f"replay: {replay.reason}")
            out["store"] = {"applied": False, "replay": replay.reason, "sequence": manifest.sequence}
            out["inputs"] = dict(ctx.counters)
            return out
        render = (
            RenderApply(job.store_dir, osc_path, job.sequence, sha256) if job.apply and render_db.is_file() else None
        )
        prepared: PreparedDiff | None = None
        try:
            diff = read(osc_path)
            _count_diff(diff, ctx)
            ctx.set_phase("resolving")
            resolution = resolve(ctx.spark, diff, geometry, manifest, params.max_zoom, job.driver_lookup_bytes)
            for name, value in resolution.counts.items():
                ctx.count(name, value)
            ctx.check_cancelled()
            check_geometry_cap(resolution.counts, params.max_zoom, params.max_tiles_per_geometry)
            ctx.set_phase("expiring")
            collected = _expire(resolution.segments, params, job, ctx)
            summarise(collected, params, ctx, out)
            if job.apply:
                # Written now, while the rendering store's update is still being built; committed last.
                ctx.set_phase("geometry store")
                prepared = PreparedDiff(geometry, manifest, diff, job.sequence, first=job.first_sequence)
        except BaseException:
            if render is not None:
                render.abandon()
            raise
        store_out: dict[str, Any] = {"applied": False, "sequence": manifest.sequence}
        try:
            if render is not None:
                ctx.set_phase("rendering store")
                store_out["render"] = render.commit()
            if params.publish and ctx.publish is not None:
                ctx.set_phase("publishing")
                out["published"] = publish(collected, params, ctx)
            if prepared is not None:
                ctx.set_phase("geometry store")
                store_out.update(prepared.commit())
        finally:
            if prepared is not None:
                prepared.rollback()  # after a failure; nothing once committed
        out["store"] = store_out
    if job.sea is not None and store_out.get("render", {}).get("sea_stale"):
        job.sea.request(
            collected.metatiles,
            ctx.publish if params.publish else None,
            max_bytes=params.batch_max_bytes,
            max_tiles=params.batch_max_tiles,
        )
    out["inputs"] = {k: v for k, v in ctx.counters.items() if k not in ("tiles", "metatiles", "published")}
    out["phase_seconds"] = ctx.timings()
    return out
