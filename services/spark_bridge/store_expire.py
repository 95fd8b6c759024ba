"""Resolving a diff against the geometry store: changed objects x node locations x way membership.

Given the parsed diff (small, on the driver) and the geometry store (SQLite keyed by id, any size), this
finds the points and segments whose tiles expire:

- a changed node: its old position (store) and new one (diff); when it moved or was deleted, every way
  using it (``node_ways``) is a changed way too;
- a changed way, and every way found above: its old geometry (old refs, old locations) and its new one
  (refs from the diff if it is in it, else the stored ones; locations from the diff where it has them,
  else the store);
- a changed relation: its old and new members: member ways as changed ways, member nodes as points;
- a relation the diff does not have but whose way changed (in the diff, or found above) or whose node
  member moved: its stored member ways, as changed ways (those the store lacks are not counted in
  ``ways``). These are the parents osm2pgsql's dependency manager re-processes (and so expires) for a
  diff (docs/spark-bridge.md).

What reads the store is three lookups (the diff's nodes, the ways and relations using them, the relations
of its ways and its relations' stored members; then the refs of the changed ways and of the parents'
member ways; then the locations of their nodes), each a primary-key or index probe per wanted id: on the
driver when the step is small, else as one Spark action per step whose tasks probe the store, on a
laptop, a standalone cluster or Spark Connect (store_lookup).
What they return is the diff's neighbourhood, not the store, and the rest (which ways changed, their old
and new lines, the counts) is driver work: dictionaries for the diff's objects, arrays for the lines
(store_lines). As Spark joins with checkpoints in between it was ~40 small Spark jobs, most of a
minutely diff's seconds.
Objects the store does not know (outside the region) are counted, not errors; a node neither the diff
nor the store has leaves a gap in its way (no segment across it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import SparkSession

from services.osmstore.geometry import GeometryStore, Manifest
from services.osmstore.osc_diff import DiffNode, DiffWay, OscDiff
from services.spark_bridge.store_lines import Ints, Locations, Side, lines, segments_table
from services.spark_bridge.store_lookup import DRIVER_LOOKUP_BYTES, StoreLookups
from services.spark_bridge.way_segments import BUFFERED_TILES_PER_SAMPLE, ExpireTooLarge

Location = tuple[float, float]


@dataclass
class StoreResolution:
    segments: pa.Table  # lon0, lat0, lon1, lat1; a point is a segment from itself to itself
    counts: dict[str, int] = field(default_factory=dict)


def _ints(values: object) -> Ints:
    return np.asarray(values, np.int64)


def _column(table: pa.Table, name: str) -> npt.NDArray[Any]:
    return table[name].to_numpy()


def _diff_locations(nodes: dict[int, DiffNode], zoom: int) -> Locations:
    """The diff's nodes; NaN for one without location (deleted): it has no new position."""
    lon = [np.nan if d.lon is None or d.lat is None else d.lon for d in nodes.values()]
    lat = [np.nan if d.lon is None or d.lat is None else d.lat for d in nodes.values()]
    return Locations(_ints(list(nodes)), np.array(lon, np.float64), np.array(lat, np.float64), zoom)


def _diff_refs(ways: dict[int, DiffWay]) -> tuple[Ints, Ints, Ints]:
    """(way, seq, node) of the diff's live ways."""
    way: list[int] = []
    seq: list[int] = []
    node: list[int] = []
    for w, d in ways.items():
        if not d.deleted:
            way += [w] * len(d.refs)
            seq += range(len(d.refs))
            node += d.refs
    return _ints(way), _ints(seq), _ints(node)


def _pairs(table: pa.Table, a: str, b: str) -> list[tuple[int, int]]:
    return list(zip(table[a].to_pylist(), table[b].to_pylist(), strict=True))


def _unique_refs(way: Ints, seq: Ints, node: Ints) -> tuple[Ints, Ints, Ints]:
    """Each (way, seq) once: a way's stored refs can come both as a changed way and as a parent's member."""
    rows = np.unique(np.stack([way, seq, node], axis=1), axis=0) if len(way) else np.zeros((0, 3), np.int64)
    return rows[:, 0], rows[:, 1], rows[:, 2]


def resolve(
    spark: SparkSession,
    diff: OscDiff,
    store: GeometryStore,
    manifest: Manifest,
    zoom: int,
    driver_lookup_bytes: int = DRIVER_LOOKUP_BYTES,
) -> StoreResolution:
    nodes, ways, rels = diff.nodes, diff.ways, diff.relations
    # Step 1: old positions of the diff's nodes, the ways using them, the stored members of its relations,
    # and the relations osm2pgsql re-processes (its parents: those of the diff's nodes, as members or through
    # their ways, and of the diff's ways). node_ways and node_relations are looked up for every diff node
    # (a superset of the moved ones) so that they need no step of their own after the positions.
    lookup = StoreLookups(spark, store, manifest, driver_lookup_bytes)
    first = lookup.fetch(
        {
            "known": ("nodes", set(nodes)),
            "node_ways": ("node_ways", set(nodes)),
            "node_relations": ("node_relations", set(nodes)),
            "way_relations": ("way_relations", set(ways)),
            "old_members": ("members", set(rels)),
        }
    )
    known = first["known"]
    old_loc: dict[int, Location] = dict(
        zip(known["id"].to_pylist(), zip(known["lon"].to_pylist(), known["lat"].to_pylist(), strict=True), strict=True)
    )
    moved = {n for n, d in nodes.items() if d.deleted or old_loc.get(n) != (d.lon, d.lat)}
    via_nodes = {w for n, w in _pairs(first["node_ways"], "node_id", "way_id") if n in moved}
    # A relation is re-expired whole when a way of it changed (in the diff, or a node of it moved) or a node
    # member moved: osm2pgsql re-processes it then, expiring its old and new geometry. A relation in the
    # diff is resolved as a changed relation below; the parents of a relation are not followed (nor by
    # osm2pgsql, docs/spark-bridge.md).
    parents = {r for n, r in _pairs(first["node_relations"], "node_id", "rel_id") if n in moved}
    parents |= set(first["way_relations"]["rel_id"].to_pylist())
    parents -= set(rels)
    om = first["old_members"]
    old_members = list(
        zip(om["rel_id"].to_pylist(), om["member_type"].to_pylist(), om["member_id"].to_pylist(), strict=True)
    )
    all_members = old_members + [(rid, t, ref) for rid, r in rels.items() if not r.deleted for t, ref, _ in r.members]
    member_ways = {m for _, t, m in all_members if t == "w"}
    member_nodes = {m for _, t, m in all_members if t == "n"}
    changed_ways = set(ways) | via_nodes | member_ways

    # Step 2: the stored refs of every changed way (its old line) and of the parents' member ways. The new
    # line: the diff's refs for a way in the diff, the stored ones for any other. A parent's node members
    # are not looked up: osm2pgsql draws a relation from its ways, and a node member that moved is in the
    # diff (its places expire as the diff's nodes).
    second = lookup.fetch({"old_refs": ("way_nodes", changed_ways), "parent_refs": ("relation_way_nodes", parents)})
    old_refs, parent_refs = second["old_refs"], second["parent_refs"]
    changed_ways |= set(np.unique(_column(parent_refs, "way_id")).tolist())
    ow, os_, on = _unique_refs(
        *(
            np.concatenate([_column(old_refs, c), _column(parent_refs, c)]).astype(np.int64)
            for c in ("way_id", "seq", "node_id")
        )
    )
    keep = ~np.isin(ow, _ints(list(ways)))
    dw, ds, dn = _diff_refs(ways)
    nw, ns, nn = np.concatenate([ow[keep], dw]), np.concatenate([os_[keep], ds]), np.concatenate([on[keep], dn])
    ref_nodes = np.unique(np.concatenate([on, nn]))

    # Step 3: stored locations of every node those lines and the relations need (diff nodes: step 1).
    # (Keying step 3 on step 2 inside one plan was tried: the chained plan ran slower than two actions.)
    needed = (set(ref_nodes.tolist()) | member_nodes) - set(nodes)
    loc = lookup.fetch({"old_loc": ("nodes", needed)})["old_loc"]
    old_loc.update(
        zip(loc["id"].to_pylist(), zip(loc["lon"].to_pylist(), loc["lat"].to_pylist(), strict=True), strict=True)
    )
    both = {c: np.concatenate([_column(known, c), _column(loc, c)]) for c in ("id", "lon", "lat")}
    stored = Locations(both["id"].astype(np.int64), both["lon"], both["lat"], zoom)
    in_diff = _diff_locations(nodes, zoom)

    def new_loc(node: int) -> Location | None:
        d = nodes.get(node)
        if d is None:
            return old_loc.get(node)
        return None if d.lon is None or d.lat is None else (d.lon, d.lat)

    points: set[Location] = set()
    for n, d in nodes.items():
        if n in old_loc:
            points.add(old_loc[n])
        if not d.deleted and (here := new_loc(n)) is not None:
            points.add(here)
    for m in member_nodes:
        points.update(p for p in (old_loc.get(m), new_loc(m)) if p is not None)
    found = lines([Side(ow, os_, on, stored), Side(nw, ns, nn, in_diff, stored)])
    _, has_old = stored.index(ref_nodes)
    diff_at, in_diff_found = in_diff.index(ref_nodes)
    has_new = np.where(in_diff_found, ~np.isnan(in_diff.lon[diff_at]), has_old)
    member_rels = {r for r, _, _ in old_members}
    old_ways = set(np.unique(ow).tolist())
    counts = {
        "unknown_nodes": sum(1 for n, d in nodes.items() if n not in old_loc and (d.version > 1 or d.deleted)),
        "unknown_ways": sum(1 for w, d in ways.items() if w not in old_ways and (d.version > 1 or d.deleted)),
        "unknown_relations": sum(1 for r, d in rels.items() if r not in member_rels and (d.version > 1 or d.deleted)),
        "missing_node_refs": int(np.count_nonzero(~has_old & ~has_new)),
        "ways": len(changed_ways),
        "moved_nodes": len(moved),
        "nested_relations": sum(1 for _, t, _ in all_members if t == "r"),
        "parent_relations": len(parents),
        "most_way_samples": found.most_samples,
    }
    return StoreResolution(segments=segments_table(found, points), counts=counts)


def check_geometry_cap(counts: dict[str, int], zoom: int, cap: int) -> None:
    worst = counts.get("most_way_samples", 0) * BUFFERED_TILES_PER_SAMPLE
    if worst > cap:
        raise ExpireTooLarge(f"a way would expire up to {worst} tiles at z{zoom}, over max_tiles_per_geometry={cap}")
