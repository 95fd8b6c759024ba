"""The expiry job: inputs -> buffered tiles at max zoom -> every zoom down to min -> metatiles.

All per-row tile math is Spark SQL column expressions (see tilemath). The job body runs in a worker
thread; it reports through a JobContext and publishes metatiles through ``ctx.publish``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from services.spark_bridge.expire_inputs import ExpireInput, InputKind, read_expire_lists, read_points
from services.spark_bridge.expire_publish import ExpirationBatcher
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.osc_reader import OscTables, read_osc
from services.spark_bridge.tilemath import (
    METATILE_SHIFT,
    WAY_SAMPLE_STEP,
    buffered_tile_range,
    frac_tile_x,
    frac_tile_y,
    shift_left,
    shift_right,
    tile_key,
)

UNRESOLVED_IDS_SHOWN = 1000


class ExpireTooLarge(RuntimeError):
    """The max-tiles guard tripped: the job would expire more tiles than allowed."""


@dataclass(frozen=True)
class ExpireParams:
    min_zoom: int
    max_zoom: int
    max_tiles: int = 50_000_000  # osm2pgsql's overall cap
    max_tiles_per_geometry: int = 10_000_000  # osm2pgsql's per-geometry cap
    publish: bool = True
    batch_max_bytes: int = 65_536
    batch_max_tiles: int = 2_000


def _frac_points(frame: DataFrame, zoom: int) -> DataFrame:
    return frame.select(frac_tile_x(F.col("lon"), zoom).alias("fx"), frac_tile_y(F.col("lat"), zoom).alias("fy"))


def _buffered_tiles(points: DataFrame, zoom: int) -> DataFrame:
    """Each fractional point -> the 1..4 tiles within the 0.1-tile buffer, at ``zoom``."""
    x0, x1 = buffered_tile_range(F.col("fx"), zoom)
    y0, y1 = buffered_tile_range(F.col("fy"), zoom)
    return (
        points.select(F.explode(F.sequence(x0, x1)).alias("x"), y0.alias("y0"), y1.alias("y1"))
        .select(F.lit(zoom).alias("z"), "x", F.explode(F.sequence("y0", "y1")).alias("y"))
    )


def _way_samples(
    nodes: DataFrame, refs: DataFrame, params: ExpireParams, ctx: JobContext
) -> tuple[DataFrame, list[int]]:
    """Points sampled along resolvable ways; returns (samples, ids of unresolved ways)."""
    zoom = params.max_zoom
    located = nodes.groupBy("node_id").agg(
        F.max_by("lon", "version").alias("lon"), F.max_by("lat", "version").alias("lat")
    )
    joined = refs.join(located, "node_id", "left")
    way_keys = ["way_id", "way_version"]
    missing = joined.groupBy(*way_keys).agg(F.count(F.when(F.col("lon").isNull(), 1)).alias("missing"))
    unresolved_keys = missing.where(F.col("missing") > 0).select(*way_keys)
    unresolved = sorted({r["way_id"] for r in unresolved_keys.select("way_id").distinct().collect()})
    resolved = joined.join(unresolved_keys, way_keys, "left_anti").select(
        *way_keys, "seq", frac_tile_x(F.col("lon"), zoom).alias("fx"), frac_tile_y(F.col("lat"), zoom).alias("fy")
    )
    order = Window.partitionBy(*way_keys).orderBy("seq")
    segments = (
        resolved.withColumn("nfx", F.lead("fx").over(order))
        .withColumn("nfy", F.lead("fy").over(order))
        .where(F.col("nfx").isNotNull())
        .withColumn(
            "steps",
            F.greatest(
                F.ceil(F.greatest(F.abs(F.col("nfx") - F.col("fx")), F.abs(F.col("nfy") - F.col("fy")))
                       / F.lit(WAY_SAMPLE_STEP)),
                F.lit(1),
            ).cast("long"),
        )
    )
    # Per-geometry guard before exploding: samples * 4 bounds the buffered tiles of one way.
    biggest = segments.groupBy("way_id").agg(F.sum("steps").alias("samples")).orderBy(F.desc("samples")).first()
    if biggest is not None and biggest["samples"] * 4 > params.max_tiles_per_geometry:
        raise ExpireTooLarge(
            f"way {biggest['way_id']} would expire up to {biggest['samples'] * 4} tiles at z{zoom}, "
            f"over max_tiles_per_geometry={params.max_tiles_per_geometry}"
        )
    ctx.check_cancelled()
    step = F.col("i") / F.col("steps")
    zero = F.lit(0).cast("long")
    samples = segments.select("fx", "nfx", "fy", "nfy", "steps", F.explode(F.sequence(zero, "steps")).alias("i"))
    samples = samples.select(
        (F.col("fx") + (F.col("nfx") - F.col("fx")) * step).alias("fx"),
        (F.col("fy") + (F.col("nfy") - F.col("fy")) * step).alias("fy"),
    )
    return samples, unresolved


def _normalise_list_tiles(tiles: DataFrame, params: ExpireParams) -> DataFrame:
    """Expire-list tiles to zoom range: above max -> ancestor at max; below min -> descendants at min."""
    lo, hi = params.min_zoom, params.max_zoom
    smallest = tiles.agg(F.min("z")).first()
    if smallest is not None and smallest[0] is not None and smallest[0] < lo:
        per_tile = 4 ** (lo - smallest[0])
        if per_tile > params.max_tiles_per_geometry:
            raise ExpireTooLarge(
                f"expire-list tile at z{smallest[0]} expands to {per_tile} tiles at min_zoom={lo}, "
                f"over max_tiles_per_geometry={params.max_tiles_per_geometry}"
            )
    dz_down = F.greatest(F.col("z") - F.lit(hi), F.lit(0))
    dz_up = F.greatest(F.lit(lo) - F.col("z"), F.lit(0))
    side = shift_left(F.lit(1).cast("long"), dz_up)
    zero = F.lit(0).cast("long")
    spread = tiles.select(
        F.least(F.greatest(F.col("z"), F.lit(lo)), F.lit(hi)).alias("z"),
        shift_left(shift_right("x", dz_down), dz_up).alias("bx"),
        shift_left(shift_right("y", dz_down), dz_up).alias("by"),
        (side - 1).alias("last"),
    )
    spread = spread.select("z", "bx", "by", "last", F.explode(F.sequence(zero, "last")).alias("dx"))
    spread = spread.select("z", (F.col("bx") + F.col("dx")).alias("x"), "by",
                           F.explode(F.sequence(zero, "last")).alias("dy"))
    return spread.select("z", "x", (F.col("by") + F.col("dy")).alias("y"))


def propagate(base: DataFrame, min_zoom: int) -> DataFrame:
    """Every tile (z >= min_zoom) and its ancestors down to min_zoom, deduplicated by 64-bit key."""
    exploded = base.select("x", "y", "z", F.explode(F.sequence(F.lit(min_zoom), F.col("z"))).alias("tz"))
    shifted = exploded.select(
        F.col("tz").alias("z"),
        shift_right("x", F.col("z") - F.col("tz")).alias("x"),
        shift_right("y", F.col("z") - F.col("tz")).alias("y"),
    )
    return shifted.withColumn("key", tile_key(F.col("z"), F.col("x"), F.col("y"))).dropDuplicates(["key"])


def metatiles(tiles: DataFrame) -> DataFrame:
    """Distinct 8x8 metatiles (z, mx, my); at z0-2 the whole zoom is one metatile 0/0."""
    return tiles.select(
        "z",
        F.shiftright("x", METATILE_SHIFT).alias("mx"),
        F.shiftright("y", METATILE_SHIFT).alias("my"),
    ).distinct()


def expire_base_tiles(
    spark: SparkSession, inputs: list[ExpireInput], params: ExpireParams, ctx: JobContext
) -> tuple[DataFrame | None, dict[str, Any]]:
    """Read every input into (z, x, y) rows with min_zoom <= z <= max_zoom (not yet deduplicated)."""
    parts: list[DataFrame] = []
    report: dict[str, Any] = {"unresolved_ways": []}
    osc_paths = [i.path for i in inputs if i.kind is InputKind.OSC]
    if osc_paths:
        osc: OscTables = read_osc(osc_paths)
        ctx.count("osc_nodes", len(osc.node_id))
        ctx.count("osc_ways", osc.ways)
        ctx.count("deleted_nodes_without_location", osc.deleted_nodes_without_location)
        ctx.check_cancelled()
        nodes = spark.createDataFrame(osc.nodes_table())
        points = _frac_points(nodes, params.max_zoom)
        if len(osc.ref_way_id):
            samples, unresolved = _way_samples(nodes, spark.createDataFrame(osc.way_refs_table()), params, ctx)
            points = points.unionByName(samples)
            report["unresolved_ways"] = sorted(set(unresolved) | set(osc.ways_without_nodes))
        else:
            report["unresolved_ways"] = sorted(set(osc.ways_without_nodes))
        parts.append(_buffered_tiles(points, params.max_zoom))
    raw_points = read_points(spark, inputs)
    if raw_points is not None:
        valid = F.col("lon").between(-180.0, 180.0) & F.col("lat").between(-90.0, 90.0)
        counts = raw_points.agg(F.count(F.lit(1)).alias("n"), F.count(F.when(valid, 1)).alias("ok")).first()
        ctx.count("points", int(counts["ok"]))
        ctx.count("invalid_points", int(counts["n"] - counts["ok"]))
        parts.append(_buffered_tiles(_frac_points(raw_points.where(valid), params.max_zoom), params.max_zoom))
    list_paths = [i.path for i in inputs if i.kind is InputKind.EXPIRE_LIST]
    if list_paths:
        listed = read_expire_lists(spark, list_paths)
        parts.append(_normalise_list_tiles(listed, params))
    ctx.check_cancelled()
    if not parts:
        return None, report
    base = parts[0]
    for part in parts[1:]:
        base = base.unionByName(part)
    return base, report


def run_expire(inputs: list[ExpireInput], params: ExpireParams, ctx: JobContext) -> dict[str, Any]:
    spark = ctx.spark
    ctx.set_phase("reading")
    base, report = expire_base_tiles(spark, inputs, params, ctx)
    unresolved: list[int] = report["unresolved_ways"]
    ctx.count("unresolved_ways", len(unresolved))
    tiles_per_zoom: dict[str, int] = {}
    metatiles_per_zoom: dict[str, int] = {}
    published = {"messages": 0, "metatiles": 0}
    if base is not None:
        ctx.set_phase("expiring")
        distinct_base = base.dropDuplicates(["z", "x", "y"]).persist()
        try:
            base_count = distinct_base.count()
            ctx.count("base_tiles", base_count)
            if base_count > params.max_tiles:
                raise ExpireTooLarge(f"{base_count} distinct input tiles exceed max_tiles={params.max_tiles}")
            ctx.set_phase("propagating")
            tiles = propagate(distinct_base, params.min_zoom).persist()
            try:
                rows = tiles.groupBy("z").count().collect()
                tiles_per_zoom = {str(r["z"]): int(r["count"]) for r in sorted(rows, key=lambda r: r["z"])}
                total = sum(tiles_per_zoom.values())
                ctx.count("tiles", total)
                if total > params.max_tiles:
                    raise ExpireTooLarge(f"{total} expired tiles exceed max_tiles={params.max_tiles}")
                ctx.set_phase("metatiles")
                metas = metatiles(tiles).persist()
                try:
                    rows = metas.groupBy("z").count().collect()
                    metatiles_per_zoom = {str(r["z"]): int(r["count"]) for r in sorted(rows, key=lambda r: r["z"])}
                    ctx.count("metatiles", sum(metatiles_per_zoom.values()))
                    if params.publish and ctx.publish is not None:
                        ctx.set_phase("publishing")
                        published = _publish(metas, params, ctx)
                finally:
                    metas.unpersist()
            finally:
                tiles.unpersist()
        finally:
            distinct_base.unpersist()
    return {
        "min_zoom": params.min_zoom,
        "max_zoom": params.max_zoom,
        "tiles_per_zoom": tiles_per_zoom,
        "metatiles_per_zoom": metatiles_per_zoom,
        "total_tiles": sum(tiles_per_zoom.values()),
        "total_metatiles": sum(metatiles_per_zoom.values()),
        "unresolved_ways": {"count": len(unresolved), "ids": unresolved[:UNRESOLVED_IDS_SHOWN]},
        "inputs": {k: v for k, v in ctx.counters.items() if k not in ("tiles", "metatiles")},
        "published": published,
    }


def _publish(metas: DataFrame, params: ExpireParams, ctx: JobContext) -> dict[str, int]:
    """Stream metatile origins to the driver in order and publish them in size-capped batches."""
    assert ctx.publish is not None
    names = metas.orderBy("z", "mx", "my").select(
        F.concat_ws(
            "/",
            F.col("z"),
            F.shiftleft("mx", METATILE_SHIFT),
            F.shiftleft("my", METATILE_SHIFT),
        ).alias("tile")
    )
    batcher = ExpirationBatcher(ctx.publish, max_bytes=params.batch_max_bytes, max_tiles=params.batch_max_tiles)
    for seen, row in enumerate(names.toLocalIterator(), start=1):
        batcher.add(row["tile"])
        if seen % 10_000 == 0:
            ctx.check_cancelled()
            ctx.count("published_metatiles", batcher.tiles_sent)
    batcher.flush()
    ctx.count("published_metatiles", batcher.tiles_sent)
    return {"messages": batcher.messages_sent, "metatiles": batcher.tiles_sent}
