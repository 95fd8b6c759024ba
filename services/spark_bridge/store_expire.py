"""Resolving a diff against the geometry store, in Spark: changed objects x node locations x way membership.

Given the parsed diff (small, on the driver) and the store's live snapshot (Parquet, any size), this
builds the points and segments whose tiles expire, as Spark DataFrames:

- a changed node: its old position (store) and new one (diff); when it moved or was deleted, every way
  using it (``node_ways``) is a changed way too;
- a changed way, and every way found above: its old geometry (old refs, old locations) and its new one
  (refs from the diff if it is in it, else the stored ones; locations from the diff where it has them,
  else the store);
- a changed relation: its old and new members: member ways as changed ways, member nodes as points.

Every lookup joins on ``(bucket, id)`` with the small side broadcast, so Spark's dynamic partition pruning
reads only the partitions the changed ids fall in: the same plan on a laptop, a standalone cluster or Spark
Connect against a planet-sized store. Objects the store does not know (outside the region) are counted,
not errors; a node neither the diff nor the store has leaves a gap in its way (no segment across it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from services.osmstore.geometry import GeometryStore, Manifest, table_bits
from services.osmstore.osc_diff import OscDiff
from services.spark_bridge.tilemath import WAY_SAMPLE_STEP, frac_tile_x, frac_tile_y
from services.spark_bridge.way_segments import BUFFERED_TILES_PER_SAMPLE, ExpireTooLarge

_SPARK_SCHEMAS = {
    "nodes": "id long, lon double, lat double, bucket long",
    "way_nodes": "way_id long, seq int, node_id long, bucket long",
    "node_ways": "node_id long, way_id long, bucket long",
    "members": "rel_id long, seq int, member_type string, member_id long, role string, bucket long",
}


_DIFF_SCHEMAS = {
    "nodes": "id long, lon double, lat double, deleted boolean, version long",
    "ways": "way_id long, deleted boolean, version long",
    "way_refs": "way_id long, seq int, node_id long",
    "rels": "rel_id long, deleted boolean, version long",
    "members": "rel_id long, member_type string, member_id long",
}


def _bucketer(manifest: Manifest) -> Any:
    def bucket(column: str, table: str) -> Any:
        return F.shiftright(F.col(column), table_bits(table, manifest.bits)).alias("bucket")

    return bucket


@dataclass
class StoreResolution:
    points: DataFrame  # lon, lat
    segments: DataFrame  # lon0, lat0, lon1, lat1
    counts: dict[str, int]
    cached: list[DataFrame]

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def _read(spark: SparkSession, store: GeometryStore, manifest: Manifest, table: str) -> DataFrame:
    return spark.read.schema(_SPARK_SCHEMAS[table]).parquet(str(store.table_dir(table, manifest)))


def _diff_frames(spark: SparkSession, diff: OscDiff) -> dict[str, DataFrame]:
    nodes = diff.nodes.items()
    ways = diff.ways.items()
    live_ways = [(wid, w) for wid, w in ways if not w.deleted]
    rels = diff.relations.items()
    members = [(rid, t, ref) for rid, r in rels if not r.deleted for t, ref, _role in r.members]
    tables = {
        "nodes": pa.table({"id": pa.array([i for i, _ in nodes], pa.int64()),
                           "lon": pa.array([n.lon for _, n in nodes], pa.float64()),
                           "lat": pa.array([n.lat for _, n in nodes], pa.float64()),
                           "deleted": pa.array([n.deleted for _, n in nodes], pa.bool_()),
                           "version": pa.array([n.version for _, n in nodes], pa.int64())}),
        "ways": pa.table({"way_id": pa.array([i for i, _ in ways], pa.int64()),
                          "deleted": pa.array([w.deleted for _, w in ways], pa.bool_()),
                          "version": pa.array([w.version for _, w in ways], pa.int64())}),
        "way_refs": pa.table({"way_id": pa.array([i for i, w in live_ways for _ in w.refs], pa.int64()),
                              "seq": pa.array([s for _, w in live_ways for s in range(len(w.refs))], pa.int32()),
                              "node_id": pa.array([r for _, w in live_ways for r in w.refs], pa.int64())}),
        "rels": pa.table({"rel_id": pa.array([i for i, _ in rels], pa.int64()),
                          "deleted": pa.array([r.deleted for _, r in rels], pa.bool_()),
                          "version": pa.array([r.version for _, r in rels], pa.int64())}),
        "members": pa.table({"rel_id": pa.array([m[0] for m in members], pa.int64()),
                             "member_type": pa.array([m[1] for m in members], pa.string()),
                             "member_id": pa.array([m[2] for m in members], pa.int64())}),
    }
    # An empty Arrow table has no rows to infer from under Spark Connect: those get their schema spelt out.
    return {name: spark.createDataFrame(table) if table.num_rows else spark.createDataFrame([], _DIFF_SCHEMAS[name])
            for name, table in tables.items()}


def _segments(points: DataFrame) -> DataFrame:
    """(side, way_id, seq, lon, lat) -> consecutive located pairs; a node without location breaks the line.

    ``side`` keeps the old and the new geometry of a way apart (each is a line of its own)."""
    order = Window.partitionBy("side", "way_id").orderBy("seq")
    nxt = points.select(
        "lon", "lat", "seq",
        F.lead("lon").over(order).alias("lon1"), F.lead("lat").over(order).alias("lat1"),
        F.lead("seq").over(order).alias("seq1"), "way_id", "side",
    )
    return nxt.where(F.col("seq1") == F.col("seq") + 1).select(
        "side", "way_id", F.col("lon").alias("lon0"), F.col("lat").alias("lat0"), "lon1", "lat1")


def resolve(spark: SparkSession, diff: OscDiff, store: GeometryStore, manifest: Manifest,
            zoom: int) -> StoreResolution:
    d = _diff_frames(spark, diff)
    _bucket = _bucketer(manifest)
    s_nodes = _read(spark, store, manifest, "nodes")
    s_way_nodes = _read(spark, store, manifest, "way_nodes")
    s_node_ways = _read(spark, store, manifest, "node_ways")
    s_members = _read(spark, store, manifest, "members")

    d_nodes = d["nodes"].withColumn("bucket", _bucket("id", "nodes"))
    known = s_nodes.join(F.broadcast(d_nodes.select("bucket", "id")), ["bucket", "id"]).select(
        "id", F.col("lon").alias("old_lon"), F.col("lat").alias("old_lat"))
    node_state = d_nodes.join(F.broadcast(known), "id", "left").localCheckpoint()
    moved = node_state.where(F.col("deleted") | F.col("old_lon").isNull()
                             | (F.col("old_lon") != F.col("lon")) | (F.col("old_lat") != F.col("lat")))
    via_nodes = s_node_ways.join(
        F.broadcast(moved.select(F.col("id").alias("node_id"), _bucket("id", "node_ways"))),
        ["bucket", "node_id"]).select("way_id")

    d_rels = d["rels"].withColumn("bucket", _bucket("rel_id", "members"))
    old_members = s_members.join(F.broadcast(d_rels.select("bucket", "rel_id")), ["bucket", "rel_id"]).select(
        "rel_id", "member_type", "member_id").localCheckpoint()
    all_members = old_members.unionByName(d["members"])
    member_ways = all_members.where(F.col("member_type") == "w").select(F.col("member_id").alias("way_id"))
    member_nodes = all_members.where(F.col("member_type") == "n").select(F.col("member_id").alias("node_id"))

    changed_ways = (d["ways"].select("way_id").unionByName(via_nodes).unionByName(member_ways).distinct()
                    .withColumn("bucket", _bucket("way_id", "way_nodes")).localCheckpoint())
    old_refs = (s_way_nodes.join(F.broadcast(changed_ways), ["bucket", "way_id"]).select("way_id", "seq", "node_id")
                .localCheckpoint())
    new_refs = old_refs.join(F.broadcast(d["ways"].select("way_id")), "way_id", "left_anti").unionByName(
        d["way_refs"])

    needed = (old_refs.select("node_id").unionByName(new_refs.select("node_id")).unionByName(member_nodes)
              .unionByName(d_nodes.select(F.col("id").alias("node_id"))).distinct()
              .withColumn("bucket", _bucket("node_id", "nodes")).localCheckpoint())
    old_loc = s_nodes.join(F.broadcast(needed.withColumnRenamed("node_id", "id")), ["bucket", "id"]).select(
        F.col("id").alias("node_id"), "lon", "lat").localCheckpoint()
    diff_loc = d_nodes.select(F.col("id").alias("node_id"), F.col("lon").alias("d_lon"),
                              F.col("lat").alias("d_lat"), F.lit(True).alias("in_diff"))
    new_loc = (needed.select("node_id").join(F.broadcast(diff_loc), "node_id", "left")
               .join(F.broadcast(old_loc), "node_id", "left")
               .select("node_id",
                       F.when(F.col("in_diff").isNotNull(), F.col("d_lon")).otherwise(F.col("lon")).alias("lon"),
                       F.when(F.col("in_diff").isNotNull(), F.col("d_lat")).otherwise(F.col("lat")).alias("lat"))
               .where(F.col("lon").isNotNull()).localCheckpoint())
    old_pts = old_refs.join(F.broadcast(old_loc), "node_id").withColumn("side", F.lit("old"))
    new_pts = new_refs.join(F.broadcast(new_loc), "node_id").withColumn("side", F.lit("new"))
    way_pts = old_pts.unionByName(new_pts).localCheckpoint()
    segments = _segments(way_pts)

    member_node_ids = F.broadcast(member_nodes.distinct())
    points = (node_state.where(F.col("old_lon").isNotNull()).select(F.col("old_lon").alias("lon"),
                                                                      F.col("old_lat").alias("lat"))
              .unionByName(node_state.where(~F.col("deleted")).select("lon", "lat"))
              .unionByName(old_loc.join(member_node_ids, "node_id").select("lon", "lat"))
              .unionByName(new_loc.join(member_node_ids, "node_id").select("lon", "lat"))
              .unionByName(way_pts.select("lon", "lat")))

    unknown_ways = d["ways"].where((F.col("version") > 1) | F.col("deleted")).join(
        old_refs.select("way_id").distinct(), "way_id", "left_anti")
    unknown_rels = d_rels.where((F.col("version") > 1) | F.col("deleted")).join(
        old_members.select("rel_id").distinct(), "rel_id", "left_anti")
    refs = old_refs.select("node_id").unionByName(new_refs.select("node_id")).distinct()
    counts = _counts(spark, [
        ("unknown_nodes", node_state.where(F.col("old_lon").isNull() & ((F.col("version") > 1) | F.col("deleted")))),
        ("unknown_ways", unknown_ways),
        ("unknown_relations", unknown_rels),
        ("missing_node_refs", refs.join(old_loc, "node_id", "left_anti").join(new_loc, "node_id", "left_anti")),
        ("ways", changed_ways),
        ("moved_nodes", moved),
        ("nested_relations", all_members.where(F.col("member_type") == "r")),
    ], {"most_way_samples": _most_samples(segments, zoom)})
    # Checkpointed (materialised, lineage cut): each is used by several of the plans below, and Spark
    # would otherwise re-plan and re-broadcast its whole subtree for every use.
    cached = [node_state, old_members, changed_ways, old_refs, needed, old_loc, new_loc, way_pts]
    return StoreResolution(points=points, segments=segments, counts=counts, cached=cached)


def _counts(spark: SparkSession, frames: list[tuple[str, DataFrame]], values: dict[str, DataFrame]) -> dict[str, int]:
    """Every count (and one-row ``n`` values) in one Spark action: a union of one-row aggregates."""
    rows = [frame.agg(F.count(F.lit(1)).alias("n")).select(F.lit(name).alias("kind"), "n") for name, frame in frames]
    rows += [frame.select(F.lit(name).alias("kind"), F.col("n").cast("long").alias("n"))
             for name, frame in values.items()]
    union: DataFrame | None = None
    for row in rows:
        union = row if union is None else union.unionByName(row)
    assert union is not None
    return {r["kind"]: int(r["n"]) for r in union.collect()}


def _most_samples(segments: DataFrame, zoom: int) -> DataFrame:
    """Samples of the longest way (one row, ``n``): osm2pgsql's per-geometry cap is checked on it before
    anything is exploded."""
    fx0, fy0 = frac_tile_x(F.col("lon0"), zoom), frac_tile_y(F.col("lat0"), zoom)
    fx1, fy1 = frac_tile_x(F.col("lon1"), zoom), frac_tile_y(F.col("lat1"), zoom)
    longest = F.greatest(F.abs(fx1 - fx0), F.abs(fy1 - fy0))
    steps = F.greatest(F.ceil(longest / F.lit(WAY_SAMPLE_STEP)), F.lit(1)) + 1
    per_way = segments.groupBy("side", "way_id").agg(F.sum(steps).alias("samples"))
    return per_way.agg(F.coalesce(F.max("samples"), F.lit(0)).cast("long").alias("n"))


def check_geometry_cap(counts: dict[str, int], zoom: int, cap: int) -> None:
    worst = counts.get("most_way_samples", 0) * BUFFERED_TILES_PER_SAMPLE
    if worst > cap:
        raise ExpireTooLarge(f"a way would expire up to {worst} tiles at z{zoom}, over max_tiles_per_geometry={cap}")

