"""The one Spark action of an expiry job: metatiles and every count, collected together as Arrow.

Why one action: on a warm session each Spark action has a fixed cost (planning, scheduling, broadcasts,
task launch; more on a loaded machine), which is what a minutely job's seconds used to be made of
(docs/spark-bridge.md, "Decisions": one Spark action per job). So the metatile aggregation and the
job's counters are unioned into one frame of ``(kind, z, mx, my, n)`` rows and collected once with
``toArrow`` (classic and Spark Connect alike); the summary, the ``max_tiles`` guard, the publishing order
and the batching are then plain driver work on that table.

Memory: the driver holds one row per expired metatile (4 columns, 28 bytes). The result is bounded by
``max_tiles`` (every metatile holds at least one expired tile), and the estimate in expire_job refuses an
oversized job before the aggregation runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from services.toposm.contract import METATILE_SHIFT
from services.toposm.expiry_wires import ExpirationBatcher

PUBLISH_CANCEL_CHECK = 5_000
_METATILE = "metatile"  # the kind of a metatile row; every other kind is a counter's name


def metatile_rows(metas: DataFrame) -> DataFrame:
    """(z, mx, my, tiles) metatiles as collect rows."""
    return metas.select(
        F.lit(_METATILE).alias("kind"),
        F.col("z").cast("int").alias("z"),
        F.col("mx").cast("long").alias("mx"),
        F.col("my").cast("long").alias("my"),
        F.col("tiles").cast("long").alias("n"),
    )


def count_row(name: str, frame: DataFrame) -> DataFrame:
    """One row: how many rows ``frame`` has."""
    return value_row(name, frame.agg(F.count(F.lit(1)).alias("n")))


def value_row(name: str, frame: DataFrame) -> DataFrame:
    """One row from a one-row frame with a numeric column ``n``."""
    none = F.lit(None)
    return frame.select(
        F.lit(name).alias("kind"),
        none.cast("int").alias("z"),
        none.cast("long").alias("mx"),
        none.cast("long").alias("my"),
        F.col("n").cast("long").alias("n"),
    )


@dataclass
class Collected:
    """The metatiles sorted by (z, mx, my) (the publishing order) and the counters, off one action."""

    metatiles: pa.Table  # z, mx, my, n (tiles in the metatile)
    counts: dict[str, int] = field(default_factory=dict)

    def per_zoom(self) -> tuple[dict[str, int], dict[str, int]]:
        """(expired tiles per zoom, metatiles per zoom), keys as strings like the job result."""
        tiles: dict[str, int] = {}
        metas: dict[str, int] = {}
        if self.metatiles.num_rows:
            grouped = self.metatiles.group_by("z").aggregate([("n", "sum"), ("n", "count")]).sort_by("z")
            for z, n_sum, n_count in zip(
                grouped["z"].to_pylist(), grouped["n_sum"].to_pylist(), grouped["n_count"].to_pylist(), strict=True
            ):
                tiles[str(z)] = int(n_sum)
                metas[str(z)] = int(n_count)
        return tiles, metas


def collect(rows: list[DataFrame]) -> Collected:
    """Run the union of ``rows`` (metatile_rows / count_row / value_row frames) as one Spark action."""
    union = rows[0]
    for frame in rows[1:]:
        union = union.unionByName(frame)
    table = union.toArrow()
    is_meta = pc.equal(table["kind"], _METATILE)
    metas = table.filter(is_meta).select(["z", "mx", "my", "n"])
    metas = metas.sort_by([("z", "ascending"), ("mx", "ascending"), ("my", "ascending")])
    counts = table.filter(pc.invert(is_meta))
    out = {k: int(n or 0) for k, n in zip(counts["kind"].to_pylist(), counts["n"].to_pylist(), strict=True)}
    return Collected(metatiles=metas, counts=out)


def publish_sorted(
    metatiles: pa.Table, send: Callable[[str], None], *, max_bytes: int, max_tiles: int, check: Callable[[int], None]
) -> dict[str, int]:
    """Publish metatile origins (z/mx*8/my*8) in the table's order, in size-capped batches.

    ``check(sent)`` runs every PUBLISH_CANCEL_CHECK names (cancel checks, progress counters).
    """
    batcher = ExpirationBatcher(send, max_bytes=max_bytes, max_tiles=max_tiles)
    zs, xs, ys = (metatiles[c].to_pylist() for c in ("z", "mx", "my"))
    for seen, (z, mx, my) in enumerate(zip(zs, xs, ys, strict=True), start=1):
        batcher.add(f"{z}/{mx << METATILE_SHIFT}/{my << METATILE_SHIFT}")
        if seen % PUBLISH_CANCEL_CHECK == 0:
            check(batcher.tiles_sent)
    batcher.flush()
    return {"messages": batcher.messages_sent, "metatiles": batcher.tiles_sent}


def collect_tables(frames: dict[str, DataFrame]) -> dict[str, pa.Table]:
    """Several small frames of different shapes computed in one Spark action, each back as an Arrow table.

    The store-backed expiry looks the diff's neighbourhood up in the store in a few dependent steps
    (diff -> ways using its nodes -> their refs -> node locations). A Spark action per lookup (and
    ``localCheckpoint`` per reused frame) was most of its seconds; one action per step is the least.
    The frames are unioned in one wide frame (every frame's columns, prefixed, null elsewhere) and split
    again on the driver.
    """
    wide: DataFrame | None = None
    for name, frame in frames.items():
        columns = [F.lit(name).alias("_frame")]
        for other, other_frame in frames.items():
            for f in other_frame.schema.fields:
                value = F.col(f.name) if other == name else F.lit(None)
                columns.append(value.cast(f.dataType).alias(f"{other}__{f.name}"))
        part = frame.select(*columns)
        wide = part if wide is None else wide.unionByName(part)
    if wide is None:
        return {}
    table = wide.toArrow()
    out: dict[str, pa.Table] = {}
    for name, frame in frames.items():
        names = [f.name for f in frame.schema.fields]
        rows = table.filter(pc.equal(table["_frame"], name)).select([f"{name}__{n}" for n in names])
        out[name] = rows.rename_columns(names)
    return out
