"""The expiry job: inputs -> buffered tiles at max zoom -> every zoom down to min -> metatiles.

All per-row tile math is Spark SQL column expressions (see tile_columns). The job body runs in a worker
thread; it reports through a JobContext and publishes metatiles through ``ctx.publish``. A warm job is
one Spark action (expire_collect): the metatiles and the counters come back together as Arrow, and the
summary, the guard and the publishing order are driver work. Only a job whose inputs cannot show that it
stays under ``max_tiles`` pays a second action first (the estimate), and only expire lists too big to
read on the driver a pass to check them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.osmstore.osc_input import InputBudget, InputLimits, InputTooLarge
from services.spark_bridge.expire_collect import Collected, collect, count_row, metatile_rows, publish_sorted
from services.spark_bridge.expire_inputs import ExpireInput, InputKind, ListTiles, read_expire_lists, read_points
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.osc_reader import read_osc
from services.spark_bridge.tile_columns import (
    WAY_SAMPLE_STEP,
    buffered_tile_range,
    frac_tile_x,
    frac_tile_y,
    shift_left,
    shift_right,
    tile_key,
)
from services.spark_bridge.way_segments import BUFFERED_TILES_PER_SAMPLE, ExpireTooLarge, resolve_ways
from services.toposm.contract import METATILE_SHIFT

__all__ = ["ExpireParams", "ExpireTooLarge", "run_expire", "propagate", "metatile_counts"]

UNRESOLVED_IDS_SHOWN = 1000
# A job of at most this many propagated rows (base rows x zooms) is aggregated with one exchange into
# SMALL_JOB_PARTITIONS partitions (expired_metatiles).
SMALL_JOB_ROWS = 4_000_000
SMALL_JOB_PARTITIONS = 2


@dataclass(frozen=True)
class ExpireParams:
    min_zoom: int
    max_zoom: int
    max_tiles: int = 50_000_000  # osm2pgsql's overall cap
    max_tiles_per_geometry: int = 10_000_000  # osm2pgsql's per-geometry cap
    publish: bool = True
    batch_max_bytes: int = 65_536
    batch_max_tiles: int = 2_000
    # osmChange bytes and objects one job may read (the bridge's --max-input-* ceilings, osc_input).
    input_limits: InputLimits = InputLimits()


def _frac_points(frame: DataFrame, zoom: int) -> DataFrame:
    return frame.select(frac_tile_x(F.col("lon"), zoom).alias("fx"), frac_tile_y(F.col("lat"), zoom).alias("fy"))


def buffered_tiles(points: DataFrame, zoom: int) -> DataFrame:
    """Each fractional point (fx, fy) -> the 1..4 tiles within the 0.1-tile buffer, at ``zoom``."""
    x0, x1 = buffered_tile_range(F.col("fx"), zoom)
    y0, y1 = buffered_tile_range(F.col("fy"), zoom)
    return points.select(F.explode(F.sequence(x0, x1)).alias("x"), y0.alias("y0"), y1.alias("y1")).select(
        F.lit(zoom).alias("z"), "x", F.explode(F.sequence("y0", "y1")).alias("y")
    )


def way_samples(segments: DataFrame, zoom: int) -> DataFrame:
    """Points every <= 0.2 tile along each (lon0, lat0) -> (lon1, lat1) segment, in tile units."""
    ends = segments.select(
        frac_tile_x(F.col("lon0"), zoom).alias("fx0"),
        frac_tile_y(F.col("lat0"), zoom).alias("fy0"),
        frac_tile_x(F.col("lon1"), zoom).alias("fx1"),
        frac_tile_y(F.col("lat1"), zoom).alias("fy1"),
    )
    longest = F.greatest(F.abs(F.col("fx1") - F.col("fx0")), F.abs(F.col("fy1") - F.col("fy0")))
    steps = F.greatest(F.ceil(longest / F.lit(WAY_SAMPLE_STEP)), F.lit(1)).cast("long")
    zero = F.lit(0).cast("long")
    exploded = ends.withColumn("steps", steps).withColumn("i", F.explode(F.sequence(zero, F.col("steps"))))
    t = F.col("i") / F.col("steps")
    return exploded.select(
        (F.col("fx0") + (F.col("fx1") - F.col("fx0")) * t).alias("fx"),
        (F.col("fy0") + (F.col("fy1") - F.col("fy0")) * t).alias("fy"),
    )


def normalise_list_tiles(tiles: DataFrame, params: ExpireParams) -> DataFrame:
    """Expire-list tiles to the zoom range: above max -> ancestor at max; below min -> descendants at min."""
    lo, hi = params.min_zoom, params.max_zoom
    dz_down = F.greatest(F.col("z") - F.lit(hi), F.lit(0))
    dz_up = F.greatest(F.lit(lo) - F.col("z"), F.lit(0))
    zero = F.lit(0).cast("long")
    spread = tiles.select(
        F.least(F.greatest(F.col("z"), F.lit(lo)), F.lit(hi)).alias("z"),
        shift_left(shift_right("x", dz_down), dz_up).alias("bx"),
        shift_left(shift_right("y", dz_down), dz_up).alias("by"),
        (shift_left(F.lit(1).cast("long"), dz_up) - 1).alias("last"),
    )
    spread = spread.withColumn("dx", F.explode(F.sequence(zero, F.col("last"))))
    spread = spread.withColumn("dy", F.explode(F.sequence(zero, F.col("last"))))
    return spread.select("z", (F.col("bx") + F.col("dx")).alias("x"), (F.col("by") + F.col("dy")).alias("y"))


def _ancestors(base: DataFrame, min_zoom: int) -> DataFrame:
    """Every tile (z >= min_zoom) and its ancestors down to min_zoom, with their 64-bit keys (duplicates kept)."""
    exploded = base.select("x", "y", "z", F.explode(F.sequence(F.lit(min_zoom), F.col("z"))).alias("tz"))
    shifted = exploded.select(
        F.col("tz").alias("z"),
        shift_right("x", F.col("z") - F.col("tz")).alias("x"),
        shift_right("y", F.col("z") - F.col("tz")).alias("y"),
    )
    return shifted.withColumn("key", tile_key(F.col("z"), F.col("x"), F.col("y")))


def propagate(base: DataFrame, min_zoom: int) -> DataFrame:
    """Every tile (z >= min_zoom) and its ancestors down to min_zoom, deduplicated by 64-bit key."""
    return _ancestors(base, min_zoom).dropDuplicates(["key"])


def expired_metatiles(base: DataFrame, params: ExpireParams, base_rows: int | None) -> DataFrame:
    """``metatile_counts(propagate(base))``, and for a job known to be small, the same with one exchange.

    The general plan shuffles twice (dedupe by key, then group by metatile), into
    ``spark.sql.shuffle.partitions`` (200 by default; adaptive execution coalesces them afterwards, but
    every map task still writes that many blocks). A minutely job has a few hundred thousand rows: it
    is repartitioned once, by metatile, into SMALL_JOB_PARTITIONS, and both the dedupe (by metatile and
    key) and the count then run where the rows already are.
    """
    zooms = params.max_zoom - params.min_zoom + 1
    if base_rows is None or base_rows * zooms > SMALL_JOB_ROWS:
        return metatile_counts(propagate(base, params.min_zoom))
    tiles = _ancestors(base, params.min_zoom).select(
        "z", "key", F.shiftright("x", METATILE_SHIFT).alias("mx"), F.shiftright("y", METATILE_SHIFT).alias("my")
    )
    together = tiles.repartition(SMALL_JOB_PARTITIONS, "z", "mx", "my").dropDuplicates(["z", "mx", "my", "key"])
    return together.groupBy("z", "mx", "my").agg(F.count(F.lit(1)).alias("tiles"))


def metatile_counts(tiles: DataFrame) -> DataFrame:
    """(z, mx, my, tiles): distinct 8x8 metatiles and how many expired tiles each holds (z0-2: 0/0)."""
    return tiles.groupBy(
        "z", F.shiftright("x", METATILE_SHIFT).alias("mx"), F.shiftright("y", METATILE_SHIFT).alias("my")
    ).agg(F.count(F.lit(1)).alias("tiles"))


@dataclass
class BaseTiles:
    """Every input as (z, x, y) rows with min_zoom <= z <= max_zoom (not yet deduplicated), and what is
    known about it before any Spark action."""

    frame: DataFrame | None
    unresolved: list[int]
    # At most this many base rows, or None when unknown without a Spark pass (point files).
    bound: int | None
    counts: list[DataFrame]  # count rows (expire_collect) computed in the job's one action


def expire_base_tiles(
    spark: SparkSession, inputs: list[ExpireInput], params: ExpireParams, ctx: JobContext
) -> BaseTiles:
    zoom = params.max_zoom
    parts: list[DataFrame] = []
    counts: list[DataFrame] = []
    unresolved: list[int] = []
    bound: int | None = 0
    osc_files = [(i.path, i.name) for i in inputs if i.kind is InputKind.OSC]
    if osc_files:
        osc = read_osc(osc_files, InputBudget(params.input_limits), ctx.reading)
        ctx.count("osc_nodes", len(osc.node_id))
        ctx.count("osc_ways", len(osc.ways) + len(osc.ways_without_nodes))
        ctx.count("deleted_nodes_without_location", osc.deleted_nodes_without_location)
        ctx.check_cancelled()
        segments = resolve_ways(osc, zoom, params.max_tiles_per_geometry)
        unresolved = segments.unresolved
        ctx.count("resolved_ways", segments.resolved)
        points = _frac_points(spark.createDataFrame(osc.nodes_table()), zoom)
        if len(segments.lon0):
            points = points.unionByName(way_samples(spark.createDataFrame(segments.table()), zoom))
        parts.append(buffered_tiles(points, zoom))
        bound = (len(osc.node_id) + segments.samples) * BUFFERED_TILES_PER_SAMPLE
    raw_points = read_points(spark, inputs)
    if raw_points is not None:
        valid = F.col("lon").between(-180.0, 180.0) & F.col("lat").between(-90.0, 90.0)
        # Counted in the job's one action, not in a pass of their own.
        counts += [count_row("points", raw_points.where(valid)), count_row("invalid_points", raw_points.where(~valid))]
        parts.append(buffered_tiles(_frac_points(raw_points.where(valid), zoom), zoom))
        bound = None
    lists = [i for i in inputs if i.kind is InputKind.EXPIRE_LIST]
    if lists:
        listed = read_expire_lists(spark, [i.path for i in lists], {i.path: i.name for i in lists})
        ctx.count("list_tiles", listed.lines)
        if listed.lines > params.input_limits.max_objects:
            limit = params.input_limits.max_objects
            raise InputTooLarge(f"the job's expire lists hold more than {limit} lines (max_input_objects={limit})")
        expanded = 0
        if listed.smallest_zoom is not None and listed.smallest_zoom < params.min_zoom:
            per_tile = 4 ** (params.min_zoom - listed.smallest_zoom)
            if per_tile > params.max_tiles_per_geometry:
                raise ExpireTooLarge(
                    f"expire-list tile at z{listed.smallest_zoom} expands to {per_tile} tiles at "
                    f"min_zoom={params.min_zoom}, over max_tiles_per_geometry={params.max_tiles_per_geometry}"
                )
            expanded = _check_list_expansion(listed, params, ctx)
        parts.append(normalise_list_tiles(listed.frame, params))
        bound = None if bound is None else bound + listed.lines + expanded
    ctx.check_cancelled()
    if not parts:
        return BaseTiles(None, unresolved, bound, counts)
    base = parts[0]
    for part in parts[1:]:
        base = base.unionByName(part)
    return BaseTiles(base, unresolved, bound, counts)


def _check_list_expansion(listed: ListTiles, params: ExpireParams, ctx: JobContext) -> int:
    """List tiles below min_zoom become 4^dz tiles each: refuse before that explosion is ever planned.

    The sum is over distinct list tiles, so it over-counts only a list naming a tile and its own
    descendants; that errs on the side of refusing. Lists read on the driver are summed there.
    """
    if listed.rows is not None:
        low = {(z, x, y) for z, x, y in zip(*listed.rows, strict=True) if z < params.min_zoom}
        expanded = sum(4 ** (params.min_zoom - z) for z, _, _ in low)
    else:
        dz = F.lit(params.min_zoom) - F.col("z")
        distinct = listed.frame.where(F.col("z") < params.min_zoom).select("z", "x", "y").distinct()
        row = distinct.agg(F.sum(shift_left(F.lit(1).cast("long"), dz * 2)).alias("tiles")).first()
        expanded = int(row["tiles"] or 0) if row is not None else 0
    ctx.count("estimated_list_expansion", expanded)
    if expanded > params.max_tiles:
        raise ExpireTooLarge(
            f"expire-list tiles below min_zoom={params.min_zoom} expand to {expanded} tiles (estimated before "
            f"expanding), over max_tiles={params.max_tiles}"
        )
    return expanded


def check_base_estimate(base: BaseTiles, params: ExpireParams, ctx: JobContext) -> None:
    """Distinct base tiles are a lower bound of the expired tiles (propagation only adds ancestors): one
    pass over them refuses an oversized job before propagation and the metatile aggregation run.

    That pass is a Spark action of its own (at 10 million list lines, a second read of the input), so it
    is skipped when the inputs alone show it cannot trip: there are never more distinct base tiles than
    base rows. The exact check on the aggregated tiles still runs before anything is published.
    """
    assert base.frame is not None
    if base.bound is not None and base.bound <= params.max_tiles:
        return
    ctx.set_phase("estimating")
    estimate = base.frame.select("z", "x", "y").distinct().count()
    ctx.count("estimated_tiles", estimate)
    if estimate > params.max_tiles:
        raise ExpireTooLarge(
            f"at least {estimate} expired tiles (estimated before propagation) exceed max_tiles={params.max_tiles}"
        )


def run_expire(inputs: list[ExpireInput], params: ExpireParams, ctx: JobContext) -> dict[str, Any]:
    ctx.set_phase("reading")
    base = expire_base_tiles(ctx.spark, inputs, params, ctx)
    unresolved = base.unresolved
    ctx.count("unresolved_ways", len(unresolved))
    result: dict[str, Any] = {
        "min_zoom": params.min_zoom,
        "max_zoom": params.max_zoom,
        "tiles_per_zoom": {},
        "metatiles_per_zoom": {},
        "total_tiles": 0,
        "total_metatiles": 0,
    }
    published = {"messages": 0, "metatiles": 0}
    if base.frame is not None:
        check_base_estimate(base, params, ctx)
        ctx.set_phase("expiring")
        rows = [metatile_rows(expired_metatiles(base.frame, params, base.bound)), *base.counts]
        collected = collect(rows)
        for name, value in collected.counts.items():
            ctx.count(name, value)
        summarise(collected, params, ctx, result)
        if params.publish and ctx.publish is not None:
            ctx.set_phase("publishing")
            published = publish(collected, params, ctx)
    result["unresolved_ways"] = {"count": len(unresolved), "ids": unresolved[:UNRESOLVED_IDS_SHOWN]}
    result["inputs"] = {k: v for k, v in ctx.counters.items() if k not in ("tiles", "metatiles", "published")}
    result["published"] = published
    return result


def summarise(collected: Collected, params: ExpireParams, ctx: JobContext, out: dict[str, Any]) -> None:
    """Per-zoom counts into the result, then the overall guard: nothing is published past it."""
    out["tiles_per_zoom"], out["metatiles_per_zoom"] = collected.per_zoom()
    out["total_tiles"] = sum(out["tiles_per_zoom"].values())
    out["total_metatiles"] = sum(out["metatiles_per_zoom"].values())
    ctx.count("tiles", out["total_tiles"])
    ctx.count("metatiles", out["total_metatiles"])
    if out["total_tiles"] > params.max_tiles:
        raise ExpireTooLarge(f"{out['total_tiles']} expired tiles exceed max_tiles={params.max_tiles}")


def publish(collected: Collected, params: ExpireParams, ctx: JobContext) -> dict[str, int]:
    """Publish the collected metatiles in (z, mx, my) order, in size-capped batches (the one publisher)."""
    assert ctx.publish is not None

    def check(sent: int) -> None:
        ctx.check_cancelled()
        ctx.count("published", sent)

    published = publish_sorted(
        collected.metatiles,
        ctx.publish,
        max_bytes=params.batch_max_bytes,
        max_tiles=params.batch_max_tiles,
        check=check,
    )
    ctx.count("published", published["metatiles"])
    return published
