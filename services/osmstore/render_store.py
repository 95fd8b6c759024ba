"""Apply an osmChange to the rendering store, all or nothing.

``apply_osc(store_dir, osc_path)`` updates the OSM tables (nodes, ways and their node lists, relations and
their members) and then rebuilds every rendered feature the change touches: the changed objects themselves,
every way using a node that moved, and every multipolygon using a changed or rebuilt way. Geometries are
rebuilt by running the same feature code as the import over a small OSM file holding those ways and
relations with their nodes' stored locations, so libosmium assembles the multipolygons exactly as it did at
import; the file leaves out the ways and relations whose tags make no feature (unless a multipolygon in it
needs the way): their features are removed and none would come back. The whole diff runs in one SQLite
transaction: any error (a corrupt or truncated file included) rolls it back and the store is as before.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import osmium

from . import render_db
from .coastline import SEA_STALE
from .features import FeatureExtractor
from .osc_input import UnreadableOsc, osm_objects, supersedes
from .tags import area_features, line_features, relation_makes_area

_CHUNK = 500  # ids per IN (...) query, well under SQLite's variable limit


class RenderStoreError(Exception):
    """The store or the diff is unusable; nothing was applied. The message names the file and the problem."""


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    items = sorted(ids)
    for i in range(0, len(items), _CHUNK):
        yield items[i:i + _CHUNK]


def _tags(obj: osmium.osm.OSMObject) -> str:
    return render_db.tags_json((t.k, t.v) for t in obj.tags)


class _DiffApplier:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.writer = render_db.FeatureWriter(conn)
        self.stats: Counter[str] = Counter()
        self.moved_nodes: set[int] = set()
        self.dirty_ways: set[int] = set()
        self.deleted_ways: set[int] = set()
        self.dirty_relations: set[int] = set()
        self.coastline_changed = False
        # What the store holds of the diff's objects, read in a few batched queries up front (``preload``)
        # and kept up to date as the diff is applied: one query per object was most of the statements.
        self.locations: dict[int, tuple[float, float]] = {}
        self.existing: dict[str, set[int]] = {"ways": set(), "relations": set()}

    def preload(self, ids: dict[str, set[int]]) -> None:
        """Read the stored state of the diff's objects (``ids``: osm type n/w/r -> ids)."""
        self.locations.update((i, (lon, lat)) for i, lon, lat in self._rows(
            "SELECT id, lon, lat FROM nodes WHERE id IN ({})", ids["n"]))
        self.existing["ways"] = self._ids("SELECT id FROM ways WHERE id IN ({})", ids["w"])
        self.existing["relations"] = self._ids("SELECT id FROM relations WHERE id IN ({})", ids["r"])
        for osm_type, osm_ids in ids.items():
            for chunk in _chunks(osm_ids):
                self.writer.preload(osm_type, chunk)
        # Every way of the diff gets its node list again (or none, deleted): the old lists go here, in a
        # statement per chunk rather than one per way.
        for chunk in _chunks(ids["w"]):
            self.conn.execute(f"DELETE FROM way_nodes WHERE way_id IN ({', '.join('?' for _ in chunk)})",  # noqa: S608
                              chunk)

    def node(self, n: osmium.osm.Node) -> None:
        old = self.locations.get(n.id)
        self.stats["features_removed"] += self.writer.remove("n", n.id)
        if n.deleted or not n.location.valid():
            self.conn.execute("DELETE FROM nodes WHERE id = ?", (n.id,))
            self.locations.pop(n.id, None)
            self.stats["nodes_deleted"] += 1
            if old is not None:
                self.moved_nodes.add(n.id)
            return
        lon, lat = n.location.lon, n.location.lat
        self.conn.execute("INSERT INTO nodes (id, lon, lat) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE "
                          "SET lon = excluded.lon, lat = excluded.lat", (n.id, lon, lat))
        self.locations[n.id] = (lon, lat)
        self.stats["nodes_created" if old is None else "nodes_modified"] += 1
        if old is not None and (old[0], old[1]) != (lon, lat):
            self.moved_nodes.add(n.id)
        FeatureExtractor(self.writer).node(n)

    def _is_coastline(self, way_ids: Iterable[int]) -> bool:
        return bool(self._ids("SELECT osm_id FROM coastline WHERE osm_type = 'w' AND osm_id IN ({})", way_ids))

    def way(self, w: osmium.osm.Way) -> None:
        existed = w.id in self.existing["ways"]
        coastline = self.writer.has_features("coastline", "w", w.id)
        if coastline is None:  # not preloaded
            coastline = self._is_coastline([w.id])
        if w.tags.get("natural") == "coastline" or coastline:
            self.coastline_changed = True
        if w.deleted:
            self.conn.execute("DELETE FROM ways WHERE id = ?", (w.id,))
            self.existing["ways"].discard(w.id)
            self.stats["features_removed"] += self.writer.remove("w", w.id)
            self.stats["ways_deleted"] += 1
            self.deleted_ways.add(w.id)
            self.dirty_ways.discard(w.id)
            return
        self.conn.execute("INSERT INTO ways (id, tags) VALUES (?, ?) ON CONFLICT (id) DO UPDATE "
                          "SET tags = excluded.tags", (w.id, _tags(w)))
        self.existing["ways"].add(w.id)
        self.conn.executemany("INSERT INTO way_nodes (way_id, seq, node_id) VALUES (?, ?, ?)",
                              [(w.id, i, ref.ref) for i, ref in enumerate(w.nodes)])
        self.stats["ways_modified" if existed else "ways_created"] += 1
        self.dirty_ways.add(w.id)
        self.deleted_ways.discard(w.id)

    def relation(self, r: osmium.osm.Relation) -> None:
        existed = r.id in self.existing["relations"]
        self.conn.execute("DELETE FROM relation_members WHERE relation_id = ?", (r.id,))
        if r.deleted:
            self.conn.execute("DELETE FROM relations WHERE id = ?", (r.id,))
            self.existing["relations"].discard(r.id)
            self.stats["features_removed"] += self.writer.remove("r", r.id)
            self.stats["relations_deleted"] += 1
            self.dirty_relations.discard(r.id)
            return
        self.conn.execute("INSERT INTO relations (id, tags) VALUES (?, ?) ON CONFLICT (id) DO UPDATE "
                          "SET tags = excluded.tags", (r.id, _tags(r)))
        self.existing["relations"].add(r.id)
        self.conn.executemany(
            "INSERT INTO relation_members (relation_id, seq, member_type, member_id, role) VALUES (?, ?, ?, ?, ?)",
            [(r.id, i, m.type, m.ref, m.role) for i, m in enumerate(r.members)])
        self.stats["relations_modified" if existed else "relations_created"] += 1
        self.dirty_relations.add(r.id)

    def _rows(self, sql: str, ids: Iterable[int]) -> Iterator[Any]:
        """The rows of ``sql``, whose ``{}`` is an ``IN`` list, for ``ids``: a query per chunk of ids, the
        chunks in id order."""
        for chunk in _chunks(ids):
            yield from self.conn.execute(sql.format(", ".join("?" for _ in chunk)), chunk)

    def _ids(self, sql: str, ids: Iterable[int]) -> set[int]:
        return {row[0] for row in self._rows(sql, ids)}

    def rebuild(self) -> None:
        """Re-derive the features of every way and relation whose geometry or tags may have changed."""
        self.dirty_ways |= self._ids("SELECT DISTINCT way_id FROM way_nodes WHERE node_id IN ({})", self.moved_nodes)
        self.dirty_ways -= self.deleted_ways
        self.dirty_relations |= self._ids(
            "SELECT DISTINCT relation_id FROM relation_members WHERE member_type = 'w' AND member_id IN ({})",
            self.dirty_ways | self.deleted_ways)
        self.dirty_relations = self._ids("SELECT id FROM relations WHERE id IN ({})", self.dirty_relations)
        if self._is_coastline(self.dirty_ways):
            self.coastline_changed = True
        for osm_type, ids in (("w", self.dirty_ways), ("r", self.dirty_relations)):
            for chunk in _chunks(ids):
                self.stats["features_removed"] += self.writer.remove_many(osm_type, chunk)
        self.stats["ways_rebuilt"] = len(self.dirty_ways)
        self.stats["relations_rebuilt"] = len(self.dirty_relations)
        if self.dirty_ways or self.dirty_relations:
            with tempfile.TemporaryDirectory(prefix="toposm-rebuild-") as tmp:
                path = Path(tmp) / "rebuild.osm.pbf"  # PBF: written and read in half the time of XML
                self._write_rebuild_file(path)
                _RebuildHandler(self.writer, self.dirty_ways, self.dirty_relations).apply_file(
                    str(path), locations=True)
        if self.coastline_changed:  # rebuilt beside the diffs (coastline.refresh_sea), not in them
            self.stats["sea_stale"] = 1

    def _area_relations(self) -> dict[int, dict[str, str]]:
        """The dirty relations that can make a feature (an area with area tags), with their tags. Only
        they go into the rebuild file: the others (routes, restrictions...) make none, and with their
        member ways and those ways' nodes they were most of the file."""
        found: dict[int, dict[str, str]] = {}
        for rel_id, tags_text in self._rows("SELECT id, tags FROM relations WHERE id IN ({})", self.dirty_relations):
            tags = json.loads(tags_text)
            if relation_makes_area(tags):
                found[rel_id] = tags
        return found

    def _write_rebuild_file(self, path: Path) -> None:
        relations = self._area_relations()
        members: dict[int, list[tuple[str, int, str]]] = {rel_id: [] for rel_id in relations}
        for rel_id, member_type, member_id, role in self._rows(
                "SELECT relation_id, member_type, member_id, role FROM relation_members "
                "WHERE relation_id IN ({}) ORDER BY relation_id, seq", relations):
            members[rel_id].append((member_type, member_id, role))
        member_ways = {m[1] for rel in members.values() for m in rel if m[0] == "w"}
        way_tags: dict[int, dict[str, str]] = {}
        wanted = self.dirty_ways | member_ways
        for way_id, tags_text in self._rows("SELECT id, tags FROM ways WHERE id IN ({})", wanted):
            tags = json.loads(tags_text)
            # A way without line or area tags makes no feature: it is needed only as a member.
            if way_id in member_ways or line_features(tags) or area_features(tags):
                way_tags[way_id] = tags
        way_ids = set(way_tags)
        writer = osmium.SimpleWriter(str(path))
        try:
            node_ids = self._ids("SELECT DISTINCT node_id FROM way_nodes WHERE way_id IN ({})", way_ids)
            for nid, lon, lat in self._rows("SELECT id, lon, lat FROM nodes WHERE id IN ({}) ORDER BY id", node_ids):
                writer.add_node(osmium.osm.mutable.Node(id=nid, location=(lon, lat), version=1))
            for chunk in _chunks(way_ids):
                # One query per chunk, not one per way (thousands of ways per diff).
                marks = ", ".join("?" for _ in chunk)
                refs: dict[int, list[int]] = {way_id: [] for way_id in chunk}
                for way_id, node_id in self.conn.execute(
                        f"SELECT way_id, node_id FROM way_nodes WHERE way_id IN ({marks}) "  # noqa: S608
                        "ORDER BY way_id, seq", chunk):
                    refs[way_id].append(node_id)
                for way_id in chunk:
                    writer.add_way(osmium.osm.mutable.Way(id=way_id, nodes=refs[way_id],
                                                          tags=way_tags[way_id], version=1))
            for rel_id in sorted(relations):
                writer.add_relation(osmium.osm.mutable.Relation(id=rel_id, members=members[rel_id],
                                                                tags=relations[rel_id], version=1))
        finally:
            writer.close()


class _RebuildHandler(osmium.SimpleHandler):
    def __init__(self, writer: render_db.FeatureWriter, ways: set[int], relations: set[int]) -> None:
        super().__init__()
        self.features = FeatureExtractor(
            writer, wanted=lambda t, i: (t == "w" and i in ways) or (t == "r" and i in relations))

    def way(self, w: osmium.osm.Way) -> None:
        self.features.way(w)

    def area(self, a: osmium.osm.Area) -> None:
        self.features.area(a)


def _diff_plan(osc_path: Path) -> tuple[dict[str, set[int]], set[int]]:
    """A first, cheap read of the diff: the ids of its objects by type (n/w/r), so that the stored state of
    all of them is looked up in a few batched queries, and the positions in the file of the versions to
    apply. An object may appear several times (a minutely diff can carry several versions of it, a merged
    one in any order): the reader's version rule (``osc_input.supersedes``) picks one, as for the geometry
    store, so the two stores end in the same state whatever the order in the file."""
    ids: dict[str, set[int]] = {"n": set(), "w": set(), "r": set()}
    winners: dict[tuple[str, int], tuple[int, int]] = {}  # (type, id) -> (version, position)
    for position, obj in enumerate(osm_objects(osc_path, str(osc_path))):
        if isinstance(obj, osmium.osm.Changeset):
            continue  # not in an osmChange; nothing to apply
        kind = obj.type_str()
        ids[kind].add(obj.id)
        known = winners.get((kind, obj.id))
        if supersedes(obj.version, None if known is None else known[0]):
            winners[(kind, obj.id)] = (obj.version, position)
    return ids, {position for _, position in winners.values()}


def _already_applied(conn: sqlite3.Connection, sequence: int | None, sha256: str | None) -> bool:
    if sha256 is not None and render_db.get_meta(conn, "last_diff_sha256") == sha256:
        return True
    stored = render_db.get_meta(conn, "sequence")
    return sequence is not None and stored is not None and stored.isdigit() and int(stored) >= sequence


def apply_osc(store_dir: Path, osc_path: Path, *, sequence: int | None = None,
              sha256: str | None = None, commit_if: Callable[[], bool] | None = None,
              connection: sqlite3.Connection | None = None) -> dict[str, int]:
    """Apply one osmChange (.osc or .osc.gz) to ``store_dir/render.sqlite``; returns what changed.

    With ``sequence`` (a replication diff) or ``sha256`` (its digest), a diff the store already holds is
    not applied again: ``{"skipped": 1}``. Both are recorded in the same transaction as the changes, so
    the store and its sequence never disagree (a follower that died after this commit but before the
    geometry store's can simply run the diff again).
    Raises RenderStoreError (and changes nothing) when the store is missing or the diff is unreadable.
    ``commit_if`` is asked inside the transaction just before COMMIT: False rolls the diff back and
    returns ``{"rolled_back": 1}`` (the Spark bridge applies the diff while it computes the expiry, and
    commits only once that succeeded). ``connection``: an open connection to the store's database to use
    (and leave open: the bridge's worker keeps one per store, with its cache); by default one of its own.
    """
    db = Path(store_dir) / render_db.RENDER_DB
    osc_path = Path(osc_path)
    if not db.is_file():
        raise RenderStoreError(f"{store_dir}: not a rendering store (no {render_db.RENDER_DB})")
    if not osc_path.is_file():
        raise RenderStoreError(f"{osc_path}: no such file")
    conn = connection or render_db.connect(db)
    conn.execute("PRAGMA busy_timeout = 30000")  # renderers read while a diff is applied
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if _already_applied(conn, sequence, sha256):
                conn.execute("ROLLBACK")
                return {"skipped": 1}
            applier = _DiffApplier(conn)
            ids, applied_positions = _diff_plan(osc_path)
            applier.preload(ids)
            for position, obj in enumerate(osm_objects(osc_path, str(osc_path))):
                if position not in applied_positions:
                    continue  # replaced by a higher (or an equal, later) version in the same diff
                if isinstance(obj, osmium.osm.Node):
                    applier.node(obj)
                elif isinstance(obj, osmium.osm.Way):
                    applier.way(obj)
                elif isinstance(obj, osmium.osm.Relation):
                    applier.relation(obj)
            applier.rebuild()
            applier.stats["features_written"] = applier.writer.written
            applied = int(render_db.get_meta(conn, "diffs_applied") or 0) + 1
            render_db.set_meta(conn, "diffs_applied", str(applied))
            if applier.coastline_changed:
                render_db.set_meta(conn, SEA_STALE, str(applied))
            render_db.set_meta(conn, "last_diff", osc_path.name)
            if sequence is not None:
                render_db.set_meta(conn, "sequence", str(sequence))
            if sha256 is not None:
                render_db.set_meta(conn, "last_diff_sha256", sha256)
            if commit_if is not None and not commit_if():
                conn.execute("ROLLBACK")
                return {"rolled_back": 1}
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    except UnreadableOsc as exc:  # names the file and the problem, never the content
        raise RenderStoreError(f"{exc}; the store is unchanged") from None
    except (RuntimeError, ValueError, OSError, EOFError, gzip.BadGzipFile) as exc:
        raise RenderStoreError(f"{osc_path}: could not apply the diff ({exc}); the store is unchanged") from exc
    finally:
        if connection is None:
            conn.close()
    return dict(applier.stats)
