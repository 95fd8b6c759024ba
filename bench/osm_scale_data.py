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
  way with its refs and a new tag) and ``DIFF_NEW_NODES`` new nodes, with versions one above the stored ones.
  Which of the extract's objects change is drawn as for one city (seeded), so that no two of them share a
  way or a relation; each is then edited in a copy drawn at random (seeded apart). The diff of one seed thus
  changes the same objects, with the same ways and nodes around them, at every K, in one city at K=1 and
  over up to 200 cities at K=200. (Picked independently, 600 moves in one city share ways and relations,
  and K=1's diff rebuilt a third of the ways K=50's did. Drawn with the rule kept per copy, K=1's draws
  were rejected where K=200's were not, which favoured short ways and objects outside relations: the K=200
  diff looked up twice the nodes, 17,700 against 9,200, and rebuilt 1,100 ways against 900.)
- **Heavier diffs** (``weight`` W, bench/osm_diff_weight.py): W times each count, in W groups each drawn as
  one diff is, the objects of group ``g`` edited in copies ``c`` with ``c % W == g``: a diff of W x 1,000
  objects against K copies is as spread as W diffs of 1,000 merged (what ``toposm-replicate`` sends when
  catching up W minutes). With more groups than copies (W > K) a group shares its copy with others, and
  objects drawn in one group that another already changed there are drawn again (a denser diff may come out
  lighter: the bench reports what it sent).
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
    src.relations = sorted(
        (src.rank("r", i), [(t, src.rank(t, r), role) for t, r, role in members], v, tags)
        for i, members, v, tags in raw_rels
    )
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
                    writer.add_node(
                        osmium.osm.mutable.Node(
                            id=self.oid("n", rank, c), version=version, location=(lon + dx, lat + dy), tags=tags
                        )
                    )
            for rank, refs, version, tags in self.src.ways:
                for c in range(self.k):
                    writer.add_way(
                        osmium.osm.mutable.Way(
                            id=self.oid("w", rank, c),
                            version=version,
                            tags=tags,
                            nodes=[self.oid("n", r, c) for r in refs],
                        )
                    )
            for rank, members, version, tags in self.src.relations:
                for c in range(self.k):
                    writer.add_relation(
                        osmium.osm.mutable.Relation(
                            id=self.oid("r", rank, c),
                            version=version,
                            tags=tags,
                            members=[(t, self.oid(t, r, c), role) for t, r, role in members],
                        )
                    )
        finally:
            writer.close()
        return {
            "nodes": len(self.src.nodes) * self.k,
            "ways": len(self.src.ways) * self.k,
            "relations": len(self.src.relations) * self.k,
        }

    def diff(self, seed: int, weight: int = 1, copies: int | None = None) -> str:
        """The benchmark's osmChange (XML text): the same changes at every K (the objects drawn by ``seed``),
        over all copies (or the first ``copies``: with 1, K=1's diff in copy 0 at any K), ``weight`` times
        the counts."""
        rng = random.Random(seed)  # the copies and the new positions; the objects have an rng of their own
        src = self.src
        spread = self.k if copies is None else min(copies, self.k)
        modify: list[str] = []
        ways, moves = self._independent(random.Random(f"objects {seed}"), rng, weight, spread)
        for (rank, lon, lat, version, tags), c in moves:
            dx, dy = self.offset(c)
            modify.append(
                node_xml(
                    self.oid("n", rank, c),
                    lon + dx + rng.uniform(-2e-4, 2e-4),
                    lat + dy + rng.uniform(-1e-4, 1e-4),
                    dict(tags),
                    version + 1,
                )
            )
        for (rank, refs, version, tags), c in ways:
            modify.append(
                way_xml(
                    self.oid("w", rank, c),
                    [self.oid("n", r, c) for r in refs],
                    {**dict(tags), "note": f"bench {seed}"},
                    version + 1,
                )
            )
        create: list[str] = []
        top = self.oid("n", len(src.universe["n"]), 0)  # above every id of the scaled extract
        w, s, e, n = src.box
        for i in range(DIFF_NEW_NODES * weight):
            dx, dy = self.offset(rng.randrange(spread))
            create.append(
                node_xml(
                    top + seed * NEW_IDS_PER_DIFF + i,
                    rng.uniform(w, e) + dx,
                    rng.uniform(s, n) + dy,
                    {"amenity": "bench"},
                    1,
                )
            )
        return osc(create=create, modify=modify)

    def _independent(
        self, objects: random.Random, copies: random.Random, weight: int, spread: int
    ) -> tuple[list[Any], list[Any]]:
        """``weight`` x DIFF_WAY_EDITS ways and x DIFF_NODE_MOVES nodes, each with the copy it is edited in:
        in ``weight`` groups, no two objects of a group sharing a way or a relation (nor one drawn twice),
        drawn by ``objects``; group ``g``'s in the copies ``c % weight == g`` of the first ``spread``, drawn
        by ``copies``. Where groups share a copy (``weight > spread``), a draw that overlaps what another
        group changed in that copy is drawn again."""
        src = self.src
        taken: set[tuple[int, str, int]] = set()  # (copy, kind, rank) changed so far
        in_group: set[tuple[int, str, int]] = set()  # (group, kind, rank) drawn so far
        slots = [[c for c in range(spread) if c % weight == g] or [g % spread] for g in range(weight)]

        def way_keys(ways: list[int]) -> set[tuple[str, int]]:
            return {("w", w) for w in ways} | {("r", r) for w in ways for r in src.way_relations.get(w, ())}

        def pick(candidates: list[Any], per_group: int, footprint: Any) -> list[Any]:
            picked: list[Any] = []
            for group in range(weight):
                wanted = len(picked) + per_group
                for _ in range(50 * per_group):  # draws; past that the diff comes out lighter (too dense for K)
                    if len(picked) == wanted:
                        break
                    item = objects.choice(candidates)
                    keys = footprint(item)
                    if not in_group.isdisjoint((group, kind, rank) for kind, rank in keys):
                        continue
                    copy = copies.choice(slots[group])
                    if not taken.isdisjoint((copy, kind, rank) for kind, rank in keys):
                        continue
                    in_group.update((group, kind, rank) for kind, rank in keys)
                    taken.update((copy, kind, rank) for kind, rank in keys)
                    picked.append((item, copy))
            return picked

        ways = pick(src.ways, DIFF_WAY_EDITS, lambda w: way_keys([w[0]]))
        return ways, pick(src.nodes, DIFF_NODE_MOVES, lambda n: way_keys(src.node_ways.get(n[0], [])) | {("n", n[0])})


def write_diff(scale: Scale, seed: int, out: Path, weight: int = 1, copies: int | None = None) -> Path:
    out.write_bytes(gzip.compress(scale.diff(seed, weight, copies).encode()))
    return out
