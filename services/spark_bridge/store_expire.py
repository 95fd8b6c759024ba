"""Resolving a diff against the geometry store: changed objects x node locations x way membership.

Given the parsed diff (small, on the driver) and the store's live snapshot (Parquet, any size), this
finds the points and segments whose tiles expire:

- a changed node: its old position (store) and new one (diff); when it moved or was deleted, every way
  using it (``node_ways``) is a changed way too;
- a changed way, and every way found above: its old geometry (old refs, old locations) and its new one
  (refs from the diff if it is in it, else the stored ones; locations from the diff where it has them,
  else the store);
- a changed relation: its old and new members: member ways as changed ways, member nodes as points.

What reads the store runs in Spark: three lookups (the diff's nodes, the ways using them and its
relations' stored members; then the refs of the changed ways; then the locations of their nodes), each
one Spark action that reads only the Parquet partitions the wanted ids fall in (see ``_Store.find``), on a
laptop, a standalone cluster or Spark Connect against a planet-sized store. What they return is the
diff's neighbourhood, not the store, and the rest (which ways changed, their old and new lines, the
counts) is dictionary work on the driver, like resolving the ways of a plain diff (way_segments). As
Spark joins with checkpoints in between it was ~40 small Spark jobs, most of a minutely diff's seconds.
Objects the store does not know (outside the region) are counted, not errors; a node neither the diff
nor the store has leaves a gap in its way (no segment across it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.osmstore.geometry import GeometryStore, Manifest, table_bits
from services.osmstore.osc_diff import OscDiff
from services.spark_bridge.expire_collect import collect_tables
from services.spark_bridge.tilemath import py_frac_tile
from services.spark_bridge.way_segments import BUFFERED_TILES_PER_SAMPLE, ExpireTooLarge, sample_steps

_SPARK_SCHEMAS = {
    "nodes": "id long, lon double, lat double, bucket long",
    "way_nodes": "way_id long, seq int, node_id long, bucket long",
    "node_ways": "node_id long, way_id long, bucket long",
    "members": "rel_id long, seq int, member_type string, member_id long, role string, bucket long",
}
# What a lookup returns from each table (its key column first).
_COLUMNS = {
    "nodes": ["id", "lon", "lat"],
    "way_nodes": ["way_id", "seq", "node_id"],
    "node_ways": ["node_id", "way_id"],
    "members": ["rel_id", "member_type", "member_id"],
}

Location = tuple[float, float]
# Lookups of up to this many ids take them as one JSON literal; more go as a broadcast local relation.
INLINE_KEYS = 100_000


@dataclass
class StoreResolution:
    segments: pa.Table  # lon0, lat0, lon1, lat1; a point is a segment from itself to itself
    counts: dict[str, int] = field(default_factory=dict)


def _sql_list(values: Iterable[int]) -> str:
    return ",".join(str(int(v)) for v in sorted(values))  # int(): nothing but digits reaches the SQL text


class _Store:
    """Lookups in the store's tables: ``find`` builds one (lazily), ``fetch`` runs several in one action."""

    def __init__(self, spark: SparkSession, store: GeometryStore, manifest: Manifest) -> None:
        self.spark, self.store, self.manifest = spark, store, manifest

    def find(self, table: str, ids: Iterable[int]) -> DataFrame:
        """Rows of ``table`` whose key is one of ``ids``, reading only the partitions they fall in.

        Partitions are pruned statically (``bucket IN (...)``, the buckets computed here: a short list).
        The ids go as one JSON string literal, exploded into a frame and broadcast-joined on the key.
        They used to go inline as an SQL ``IN (...)`` list, but classic PySpark analyses a plan at every
        transformation, and a plan holding 20,000 literals took 0.3-0.5 s to build and as long again to
        optimise, per lookup (one literal: ~0.05 s, the lookup's run 0.15-0.35 s instead of 0.3-0.5 s).
        ``Column.isin`` is worse (a JVM call per value), and a frame made with ``createDataFrame`` is an
        RDD scan, so its broadcast is a Spark job of its own; above INLINE_KEYS ids it is used anyway, so
        that no literal gets huge."""
        key = _COLUMNS[table][0]
        keys = sorted(set(ids))
        rows = self.spark.read.schema(_SPARK_SCHEMAS[table]).parquet(str(self.store.table_dir(table, self.manifest)))
        if not keys:
            return rows.where(F.lit(False)).select(*_COLUMNS[table])  # optimised away: no Spark work
        bits = table_bits(table, self.manifest.bits)
        rows = rows.where(F.expr(f"bucket IN ({_sql_list({k >> bits for k in keys})})"))
        if len(keys) <= INLINE_KEYS:
            # json.dumps of ints: nothing but digits and commas reaches the literal.
            literal = F.from_json(F.lit(json.dumps(keys)), "array<bigint>")
            wanted = self.spark.range(1).select(F.explode(literal).alias(key))
        else:
            wanted = self.spark.createDataFrame(pa.table({key: pa.array(keys, pa.int64())}))
        return rows.join(F.broadcast(wanted), key).select(*_COLUMNS[table])

    def fetch(self, frames: dict[str, DataFrame]) -> dict[str, dict[str, list[Any]]]:
        """Every frame's rows as columns of Python values, in one Spark action."""
        return {name: {c: table[c].to_pylist() for c in table.column_names}
                for name, table in collect_tables(frames).items()}


def _ways(rows: dict[str, list[Any]]) -> dict[int, list[tuple[int, int]]]:
    """way_nodes rows -> way id -> [(seq, node id)]."""
    out: dict[int, list[tuple[int, int]]] = {}
    for way, seq, node in zip(rows["way_id"], rows["seq"], rows["node_id"], strict=True):
        out.setdefault(way, []).append((seq, node))
    return out


class _Lines:
    """Located vertices of each (side, way), and the points and segments they make."""

    def __init__(self, zoom: int) -> None:
        self.zoom = zoom
        # Sets: an unchanged line is the same on its old and new side, and points repeat; duplicates
        # would only be exploded and deduplicated again in Spark.
        self.points: set[Location] = set()
        self.segments: set[tuple[float, float, float, float]] = set()
        self.most_samples = 0
        self._frac: dict[Location, tuple[float, float]] = {}

    def _tile(self, loc: Location) -> tuple[float, float]:
        frac = self._frac.get(loc)
        if frac is None:
            frac = self._frac[loc] = py_frac_tile(loc[0], loc[1], self.zoom)
        return frac

    def add(self, refs: list[tuple[int, int]], locate: Any) -> None:
        """One side of one way: consecutive ``seq`` with both nodes located make a segment (a node without
        location breaks the line there); a located node that starts no segment is a point."""
        located = sorted((seq, loc) for seq, node in refs if (loc := locate(node)) is not None)
        samples = 0
        for i, (seq0, start) in enumerate(located):
            if i + 1 < len(located) and located[i + 1][0] == seq0 + 1:
                end = located[i + 1][1]
                self.segments.add((*start, *end))
                samples += sample_steps(*self._tile(start), *self._tile(end)) + 1
            else:
                # A vertex that starts a segment is that segment's first sample already (exactly: the
                # sample at t=0 is the vertex itself), so only the others are points of their own.
                self.points.add(start)
        self.most_samples = max(self.most_samples, samples)

    def table(self) -> pa.Table:
        """Segments, and every point as a segment of length zero (its samples are the point): one table,
        so Spark gets one local relation and one sampling plan."""
        rows = list(self.segments) + [(*p, *p) for p in self.points - {s[:2] for s in self.segments}]
        columns = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
        return pa.table({name: pa.array(values, pa.float64())
                         for name, values in zip(("lon0", "lat0", "lon1", "lat1"), columns, strict=True)})


def resolve(spark: SparkSession, diff: OscDiff, store: GeometryStore, manifest: Manifest,
            zoom: int) -> StoreResolution:
    nodes, ways, rels = diff.nodes, diff.ways, diff.relations
    # Step 1: old positions of the diff's nodes, the ways using them, the stored members of its relations.
    # node_ways is looked up for every diff node (a superset of the moved ones) so that it needs no step
    # of its own after the positions.
    lookup = _Store(spark, store, manifest)
    first = lookup.fetch({"known": lookup.find("nodes", nodes), "node_ways": lookup.find("node_ways", nodes),
                          "old_members": lookup.find("members", rels)})
    known = first["known"]
    old_loc: dict[int, Location] = dict(zip(known["id"], zip(known["lon"], known["lat"], strict=True), strict=True))
    moved = {n for n, d in nodes.items() if d.deleted or old_loc.get(n) != (d.lon, d.lat)}
    via_nodes = {w for n, w in zip(first["node_ways"]["node_id"], first["node_ways"]["way_id"], strict=True)
                 if n in moved}
    om = first["old_members"]
    old_members = list(zip(om["rel_id"], om["member_type"], om["member_id"], strict=True))
    all_members = old_members + [(rid, t, ref) for rid, r in rels.items() if not r.deleted for t, ref, _ in r.members]
    member_ways = {m for _, t, m in all_members if t == "w"}
    member_nodes = {m for _, t, m in all_members if t == "n"}
    changed_ways = set(ways) | via_nodes | member_ways

    # Step 2: the stored refs of every changed way (its old line).
    old_refs = _ways(lookup.fetch({"old_refs": lookup.find("way_nodes", changed_ways)})[
        "old_refs"])
    new_refs = {w: refs for w, refs in old_refs.items() if w not in ways}
    new_refs.update({w: list(enumerate(d.refs)) for w, d in ways.items() if not d.deleted})
    ref_nodes = {n for refs in (*old_refs.values(), *new_refs.values()) for _, n in refs}

    # Step 3: stored locations of every node those lines and the relations need (diff nodes: step 1).
    # (Keying step 3 on step 2 inside one plan was tried: the chained plan ran slower than two actions.)
    needed = (ref_nodes | member_nodes) - set(nodes)
    loc = lookup.fetch({"old_loc": lookup.find("nodes", needed)})["old_loc"]
    old_loc.update(zip(loc["id"], zip(loc["lon"], loc["lat"], strict=True), strict=True))

    def new_loc(node: int) -> Location | None:
        d = nodes.get(node)
        if d is None:
            return old_loc.get(node)
        return None if d.lon is None or d.lat is None else (d.lon, d.lat)

    lines = _Lines(zoom)
    for n, d in nodes.items():
        if n in old_loc:
            lines.points.add(old_loc[n])
        if not d.deleted and (here := new_loc(n)) is not None:
            lines.points.add(here)
    for m in member_nodes:
        lines.points.update(p for p in (old_loc.get(m), new_loc(m)) if p is not None)
    for refs in old_refs.values():
        lines.add(refs, old_loc.get)
    for refs in new_refs.values():
        lines.add(refs, new_loc)
    member_rels = {r for r, _, _ in old_members}
    counts = {
        "unknown_nodes": sum(1 for n, d in nodes.items() if n not in old_loc and (d.version > 1 or d.deleted)),
        "unknown_ways": sum(1 for w, d in ways.items() if w not in old_refs and (d.version > 1 or d.deleted)),
        "unknown_relations": sum(1 for r, d in rels.items() if r not in member_rels and (d.version > 1 or d.deleted)),
        "missing_node_refs": sum(1 for n in ref_nodes if n not in old_loc and new_loc(n) is None),
        "ways": len(changed_ways),
        "moved_nodes": len(moved),
        "nested_relations": sum(1 for _, t, _ in all_members if t == "r"),
        "most_way_samples": lines.most_samples,
    }
    return StoreResolution(segments=lines.table(), counts=counts)


def check_geometry_cap(counts: dict[str, int], zoom: int, cap: int) -> None:
    worst = counts.get("most_way_samples", 0) * BUFFERED_TILES_PER_SAMPLE
    if worst > cap:
        raise ExpireTooLarge(f"a way would expire up to {worst} tiles at z{zoom}, over max_tiles_per_geometry={cap}")
