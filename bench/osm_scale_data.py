"""The real Helsinki extract scaled K times, and the same ~1,000-object diff against any K (bench/osm_scale.py).

- **Copies on a grid.** Copy ``c`` of the extract is laid at column ``c % side``, row ``c // side`` of a
  square grid (``side = ceil(sqrt(K))``), ``LON_STEP`` / ``LAT_STEP`` degrees apart: far enough that a
  metatile at z15 and above over copy 0 sees copy 0 only, so renders of the same metatiles from K=1 and
  K=200 draw the same features and differ only in how much store there is to search.
- **Ids spread over the real OSM id ranges.** For each kind, the extract's ids (and the ids its ways and
  relations reference but it lacks: ways cut at the extract's edge stay cut) are ranked; copy ``c`` of rank
  ``i`` gets global rank ``i * K + c`` and id ``1 + rank * (ID_RANGE[kind] // (n * K))``. The copies are
  interleaved over the whole range, as in a real country extract, and the file stays sorted by id.
- **The same diff each time**: ``DIFF_NODE_MOVES`` node moves, ``DIFF_WAY_EDITS`` tag-only way edits (the
  way with its refs and a new tag) and ``DIFF_NEW_NODES`` new nodes, each in a copy picked at random
  (seeded), with versions one above the stored ones. The moved nodes and edited ways are picked so that
  no two of them in one copy share a way or a relation: the diff then changes as many ways and relations,
  of the same shapes, at every K. (Picked independently, 600 moves in one city share ways and relations,
  and K=1's diff rebuilt a third of the ways K=50's did: the store's size was measured together with a
  lighter diff.)
- **Heavier diffs** (``weight`` W, bench/osm_diff_weight.py): W times each count, drawn the same way over
  all copies, so a diff of W x 1,000 objects against K copies is as spread as W diffs of 1,000 merged
  (what ``toposm-replicate`` sends when catching up W minutes). Up to about one diff's worth per copy
  (W <= K) the picks stay independent; a denser diff comes out lighter (the bench reports what it sent).
"""

from __future__ import annotations

import gzip
import math
import random
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import osmium

from harness.osm import node_xml, osc, way_xml

LON_STEP, LAT_STEP = 0.2, 0.1  # degrees between copies (~11 km both ways at 60 N; the extract is ~1.7 km)
# Just above today's highest OSM ids (late 2026): nodes ~1.3e10, ways ~1.4e9, relations ~1.9e7.
ID_RANGE = {"n": 13_000_000_000, "w": 1_400_000_000, "r": 19_000_000}
DIFF_NODE_MOVES, DIFF_WAY_EDITS, DIFF_NEW_NODES = 600, 300, 100
REPLICATION_SEQUENCE = 1000  # the header's sequence: the first diff is 1001
NEW_IDS_PER_DIFF = 1_000_000  # new node ids per diff (seed): room for any weight


@dataclass
class Source:
    """The extract in memory, by rank (index into the sorted id universe of each kind)."""

    universe: dict[str, list[int]] = field(default_factory=dict)  # kind -> sorted ids (defined or referenced)
    nodes: list[tuple[int, float, float, int, list[tuple[str, str]]]] = field(default_factory=list)
    ways: list[tuple[int, list[int], int, list[tuple[str, str]]]] = field(default_factory=list)
    relations: list[tuple[int, list[tuple[str, int, str]], int, list[tuple[str, str]]]] = field(default_factory=list)
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # west, south, east, north
    node_ways: dict[int, list[int]] = field(default_factory=dict)  # node rank -> ranks of the ways using it
    way_relations: dict[int, list[int]] = field(default_factory=dict)  # way rank -> ranks of its relations

    def rank(self, kind: str, osm_id: int) -> int:
        return bisect_left(self.universe[kind], osm_id)


def read_source(extract: Path) -> Source:
    raw_nodes, raw_ways, raw_rels = [], [], []
    ids: dict[str, set[int]] = {"n": set(), "w": set(), "r": set()}
    for obj in osmium.FileProcessor(str(extract)):
        tags = [(t.k, t.v) for t in obj.tags]
        if obj.is_node():
            raw_nodes.append((obj.id, obj.location.lon, obj.location.lat, obj.version, tags))
            ids["n"].add(obj.id)
        elif obj.is_way():
            refs = [n.ref for n in obj.nodes]
            raw_ways.append((obj.id, refs, obj.version, tags))
            ids["w"].add(obj.id)
            ids["n"].update(refs)
        elif obj.is_relation():
            members = [(m.type, m.ref, m.role) for m in obj.members]
            raw_rels.append((obj.id, members, obj.version, tags))
            ids["r"].add(obj.id)
            for t, ref, _ in members:
                ids[t].add(ref)
    src = Source(universe={k: sorted(v) for k, v in ids.items()})
    src.nodes = sorted((src.rank("n", i), lon, lat, v, t) for i, lon, lat, v, t in raw_nodes)
    src.ways = sorted((src.rank("w", i), [src.rank("n", r) for r in refs], v, t) for i, refs, v, t in raw_ways)
    src.relations = sorted((src.rank("r", i), [(t, src.rank(t, r), role) for t, r, role in members], v, tags)
                           for i, members, v, tags in raw_rels)
    for rank, refs, _, _ in src.ways:
        for r in refs:
            src.node_ways.setdefault(r, []).append(rank)
    for rank, members, _, _ in src.relations:
        for t, r, _ in members:
            if t == "w":
                src.way_relations.setdefault(r, []).append(rank)
    lons = [n[1] for n in src.nodes]
    lats = [n[2] for n in src.nodes]
    src.box = (min(lons), min(lats), max(lons), max(lats))
    return src


@dataclass(frozen=True)
class Scale:
    src: Source
    k: int

    @property
    def side(self) -> int:
        return math.ceil(math.sqrt(self.k))

    def oid(self, kind: str, rank: int, copy: int) -> int:
        step = ID_RANGE[kind] // (len(self.src.universe[kind]) * self.k)
        return 1 + (rank * self.k + copy) * step

    def offset(self, copy: int) -> tuple[float, float]:
        return (copy % self.side) * LON_STEP, (copy // self.side) * LAT_STEP

    def box(self) -> tuple[float, float, float, float]:
        w, s, e, n = self.src.box
        rows = math.ceil(self.k / self.side)
        return w, s, e + (min(self.k, self.side) - 1) * LON_STEP, n + (rows - 1) * LAT_STEP

    def write_pbf(self, out: Path) -> dict[str, int]:
        """The scaled extract as PBF (sorted by type, then id; header with the box and a sequence)."""
        out.unlink(missing_ok=True)
        header = osmium.io.Header()
        w, s, e, n = self.box()
        header.add_box(osmium.osm.Box(osmium.osm.Location(w, s), osmium.osm.Location(e, n)))
        header.set("osmosis_replication_sequence_number", str(REPLICATION_SEQUENCE))
        header.set("generator", "qbroker bench/osm_scale_data.py")
        writer = osmium.SimpleWriter(str(out), 1 << 24, header)
        offsets = [self.offset(c) for c in range(self.k)]
        try:
            for rank, lon, lat, version, tags in self.src.nodes:
                for c, (dx, dy) in enumerate(offsets):
                    writer.add_node(osmium.osm.mutable.Node(id=self.oid("n", rank, c), version=version,
                                                            location=(lon + dx, lat + dy), tags=tags))
            for rank, refs, version, tags in self.src.ways:
                for c in range(self.k):
                    writer.add_way(osmium.osm.mutable.Way(id=self.oid("w", rank, c), version=version, tags=tags,
                                                          nodes=[self.oid("n", r, c) for r in refs]))
            for rank, members, version, tags in self.src.relations:
                for c in range(self.k):
                    writer.add_relation(osmium.osm.mutable.Relation(
                        id=self.oid("r", rank, c), version=version, tags=tags,
                        members=[(t, self.oid(t, r, c), role) for t, r, role in members]))
        finally:
            writer.close()
        return {"nodes": len(self.src.nodes) * self.k, "ways": len(self.src.ways) * self.k,
                "relations": len(self.src.relations) * self.k}

    def diff(self, seed: int, weight: int = 1, copies: int | None = None) -> str:
        """The benchmark's osmChange (XML text): the same mix of changes at every K, over all copies (or the
        first ``copies``: with 1, the same changes as K=1's in copy 0 at any K), ``weight`` times the counts."""
        rng = random.Random(seed)
        src = self.src
        spread = self.k if copies is None else min(copies, self.k)
        modify: list[str] = []
        ways, moves = self._independent(rng, weight, spread)
        for (rank, lon, lat, version, tags), c in moves:
            dx, dy = self.offset(c)
            modify.append(node_xml(self.oid("n", rank, c), lon + dx + rng.uniform(-2e-4, 2e-4),
                                   lat + dy + rng.uniform(-1e-4, 1e-4), dict(tags), version + 1))
        for (rank, refs, version, tags), c in ways:
            modify.append(way_xml(self.oid("w", rank, c), [self.oid("n", r, c) for r in refs],
                                  {**dict(tags), "note": f"bench {seed}"}, version + 1))
        create: list[str] = []
        top = self.oid("n", len(src.universe["n"]), 0)  # above every id of the scaled extract
        w, s, e, n = src.box
        for i in range(DIFF_NEW_NODES * weight):
            dx, dy = self.offset(rng.randrange(spread))
            create.append(node_xml(top + seed * NEW_IDS_PER_DIFF + i, rng.uniform(w, e) + dx,
                                   rng.uniform(s, n) + dy, {"amenity": "bench"}, 1))
        return osc(create=create, modify=modify)

    def _independent(self, rng: random.Random, weight: int, spread: int) -> tuple[list[Any], list[Any]]:
        """``weight`` x DIFF_WAY_EDITS ways and x DIFF_NODE_MOVES nodes, each with the copy it is edited in
        (one of the first ``spread``), drawn at random; no two in one copy share a way or a relation (nor is
        one object drawn twice)."""
        src = self.src
        taken: set[tuple[int, str, int]] = set()  # (copy, kind, rank)

        def way_keys(ways: list[int]) -> set[tuple[str, int]]:
            return {("w", w) for w in ways} | {("r", r) for w in ways for r in src.way_relations.get(w, ())}

        def pick(candidates: list[Any], wanted: int, footprint: Any) -> list[Any]:
            picked: list[Any] = []
            for _ in range(50 * wanted):  # draws; past that the diff comes out lighter (too dense for K)
                if len(picked) == wanted:
                    break
                item, copy = rng.choice(candidates), rng.randrange(spread)
                keys = {(copy, kind, rank) for kind, rank in footprint(item)}
                if taken.isdisjoint(keys):
                    taken.update(keys)
                    picked.append((item, copy))
            return picked

        ways = pick(src.ways, DIFF_WAY_EDITS * weight, lambda w: way_keys([w[0]]))
        return ways, pick(src.nodes, DIFF_NODE_MOVES * weight,
                          lambda n: way_keys(src.node_ways.get(n[0], [])) | {("n", n[0])})


def write_diff(scale: Scale, seed: int, out: Path, weight: int = 1, copies: int | None = None) -> Path:
    out.write_bytes(gzip.compress(scale.diff(seed, weight, copies).encode()))
    return out
