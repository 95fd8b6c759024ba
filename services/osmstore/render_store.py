"""Apply an osmChange to the rendering store, all or nothing.

``apply_osc(store_dir, osc_path)`` updates the OSM tables (the tags of ways and relations, and the members of
the relations that can make an area) and then rebuilds every rendered feature the change touches: the
changed objects themselves, every way using a node that moved, and every multipolygon using a changed or
rebuilt way. Node locations and way node lists are the geometry store's (the middle, attached read-only:
``render_db.attach_geometry``), which holds the state *before* the diff until the diff is committed there
too, after this store (``spark_bridge.store_job``; ``store_diff.apply_to_store`` without Spark): the state
after the diff is that state with the diff's own nodes and ways laid over it, and this store refuses a diff
when the geometry store is not at its own state (``render_diff_checks.check_in_step``). Areas and
multipolygons are rebuilt by running the same feature code as the import over a small OSM file holding
those ways and relations with their nodes' stored locations, so libosmium assembles them exactly as it did
at import; the file leaves out the ways and relations whose tags make no feature (unless a multipolygon in
it needs the way): their features are removed and none would come back. Ways that can make lines only (most of
a diff's) stay out of the file too: their lines are drawn from the same locations in Python
(``FeatureExtractor.line``, the same features, a faster update: docs/performance.md, "The OSM stores'
design"). The whole diff runs in one SQLite transaction: any error (a corrupt or truncated file included)
rolls it back and the store is as before.
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
from .features import FeatureExtractor, line_coords
from .geometry import GEOMETRY_DB, GEOMETRY_DIR
from .osc_input import UnreadableOsc, osm_objects
from .render_db import GEOMETRY
from .render_diff_checks import RenderStoreError, already_applied, check_in_step, diff_plan
from .tags import area_features, line_features, relation_makes_area

_CHUNK = 500  # ids per IN (...) query, well under SQLite's variable limit
# The middle, in the geometry store (attached as GEOMETRY); ``{}`` is the IN list ``_rows`` fills.
_LOCATIONS = f"SELECT id, lon, lat FROM {GEOMETRY}.nodes WHERE id IN ({{}})"  # noqa: S608
_NODE_LISTS = f"SELECT id, nodes FROM {GEOMETRY}.ways WHERE id IN ({{}})"  # noqa: S608
_WAYS_OF_NODES = f"SELECT DISTINCT way_id FROM {GEOMETRY}.node_ways WHERE node_id IN ({{}})"  # noqa: S608


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    items = sorted(ids)
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


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
        # The diff laid over the geometry store's state: its nodes (their location now in ``locations``, or
        # none if deleted) and the node lists of its ways that remain.
        self.diff_nodes: set[int] = set()
        self.way_refs: dict[int, list[int]] = {}

    def preload(self, ids: dict[str, set[int]]) -> None:
        """Read the stored state of the diff's objects (``ids``: osm type n/w/r -> ids)."""
        self.locations.update((i, (lon, lat)) for i, lon, lat in self._rows(_LOCATIONS, ids["n"]))
        self.existing["ways"] = self._ids("SELECT id FROM ways WHERE id IN ({})", ids["w"])
        self.existing["relations"] = self._ids("SELECT id FROM relations WHERE id IN ({})", ids["r"])
        for osm_type, osm_ids in ids.items():
            for chunk in _chunks(osm_ids):
                self.writer.preload(osm_type, chunk)

    def node(self, n: osmium.osm.Node) -> None:
        old = self.locations.get(n.id)
        self.diff_nodes.add(n.id)
        self.stats["features_removed"] += self.writer.remove("n", n.id)
        if n.deleted or not n.location.valid():
            self.locations.pop(n.id, None)
            self.stats["nodes_deleted"] += 1
            if old is not None:
                self.moved_nodes.add(n.id)
            return
        lon, lat = n.location.lon, n.location.lat
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
            self.way_refs.pop(w.id, None)
            return
        # Tags as stored are left alone (most modified ways gained or lost a node): rewritten, even
        # unchanged, the row's page went into the diff's commit.
        self.conn.execute(
            "INSERT INTO ways (id, tags) VALUES (?, ?) ON CONFLICT (id) DO UPDATE "
            "SET tags = excluded.tags WHERE tags IS NOT excluded.tags",
            (w.id, _tags(w)),
        )
        self.existing["ways"].add(w.id)
        self.way_refs[w.id] = [ref.ref for ref in w.nodes]
        self.stats["ways_modified" if existed else "ways_created"] += 1
        self.dirty_ways.add(w.id)
        self.deleted_ways.discard(w.id)

    def relation(self, r: osmium.osm.Relation) -> None:
        existed = r.id in self.existing["relations"]
        members = [(m.type, m.ref, m.role) for m in r.members]
        same_members = (
            not r.deleted
            and self.conn.execute(  # as for a way's tags: nothing written then
                "SELECT member_type, member_id, role FROM relation_members WHERE relation_id = ? ORDER BY seq", (r.id,)
            ).fetchall()
            == members
        )
        if not same_members:
            self.conn.execute("DELETE FROM relation_members WHERE relation_id = ?", (r.id,))
        if r.deleted:
            self.conn.execute("DELETE FROM relations WHERE id = ?", (r.id,))
            self.existing["relations"].discard(r.id)
            self.stats["features_removed"] += self.writer.remove("r", r.id)
            self.stats["relations_deleted"] += 1
            self.dirty_relations.discard(r.id)
            return
        self.conn.execute(
            "INSERT INTO relations (id, tags) VALUES (?, ?) ON CONFLICT (id) DO UPDATE "
            "SET tags = excluded.tags WHERE tags IS NOT excluded.tags",
            (r.id, _tags(r)),
        )
        self.existing["relations"].add(r.id)
        if not same_members:
            self.conn.executemany(
                "INSERT INTO relation_members (relation_id, seq, member_type, member_id, role) VALUES (?, ?, ?, ?, ?)",
                [(r.id, i, *m) for i, m in enumerate(members)],
            )
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
        # The ways that used a moved node before the diff; the diff's own ways are dirty already.
        self.dirty_ways |= self._ids(_WAYS_OF_NODES, self.moved_nodes)
        self.dirty_ways -= self.deleted_ways
        self.dirty_relations |= self._ids(
            "SELECT DISTINCT relation_id FROM relation_members WHERE member_type = 'w' AND member_id IN ({})",
            self.dirty_ways | self.deleted_ways,
        )
        self.dirty_relations = self._ids("SELECT id FROM relations WHERE id IN ({})", self.dirty_relations)
        if self._is_coastline(self.dirty_ways):
            self.coastline_changed = True
        for osm_type, ids in (("w", self.dirty_ways), ("r", self.dirty_relations)):
            for chunk in _chunks(ids):
                self.writer.stage_many(osm_type, chunk)
        self.stats["ways_rebuilt"] = len(self.dirty_ways)
        self.stats["relations_rebuilt"] = len(self.dirty_relations)
        if self.dirty_ways or self.dirty_relations:
            with tempfile.TemporaryDirectory(prefix="toposm-rebuild-") as tmp:
                path = Path(tmp) / "rebuild.osm.pbf"  # PBF: written and read in half the time of XML
                if self._write_rebuild_file(path):
                    _RebuildHandler(self.writer, self.dirty_ways, self.dirty_relations).apply_file(
                        str(path), locations=True
                    )
        self.stats["features_removed"] += self.writer.drop_staged()
        self.stats["features_kept"] = self.writer.kept
        self.stats["features_rewritten"] = self.writer.rewritten
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

    def _way_refs(self, way_ids: set[int]) -> dict[int, list[int]]:
        """The node lists of ``way_ids`` after the diff: the diff's own, else the geometry store's."""
        refs = {way_id: self.way_refs[way_id] for way_id in way_ids if way_id in self.way_refs}
        for way_id, nodes in self._rows(_NODE_LISTS, way_ids - refs.keys()):
            refs[way_id] = json.loads(nodes)
        return refs

    def _node_locations(self, node_ids: set[int]) -> dict[int, tuple[float, float]]:
        """The locations of ``node_ids`` after the diff (those it deleted, or no store holds, left out)."""
        located = {nid: self.locations[nid] for nid in node_ids & self.diff_nodes if nid in self.locations}
        located.update((nid, (lon, lat)) for nid, lon, lat in self._rows(_LOCATIONS, node_ids - self.diff_nodes))
        return located

    def _lines_only(self, way_ids: set[int], way_tags: dict[int, dict[str, str]], member_ways: set[int]) -> set[int]:
        """The rebuilt ways that can make lines only: no area tags, in no multipolygon being rebuilt."""
        return {w for w in way_ids & self.dirty_ways if w not in member_ways and not area_features(way_tags[w])}

    def _write_rebuild_file(self, path: Path) -> bool:
        """Write the features of the rebuilt ways that can only make lines, and ``path`` with what libosmium
        must assemble (areas and multipolygons, their ways and nodes); False when that is nothing."""
        relations = self._area_relations()
        members: dict[int, list[tuple[str, int, str]]] = {rel_id: [] for rel_id in relations}
        for rel_id, member_type, member_id, role in self._rows(
            "SELECT relation_id, member_type, member_id, role FROM relation_members "
            "WHERE relation_id IN ({}) ORDER BY relation_id, seq",
            relations,
        ):
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
        refs = self._way_refs(way_ids)
        located = self._node_locations({nid for way_refs in refs.values() for nid in way_refs})
        # A way with no area tags and in no multipolygon rebuilt makes lines only: made here from its nodes'
        # locations as FeatureExtractor.way makes them from the file (the same coordinates: the file holds
        # them at OSM's 1e-7 degree, as the stores do), so most ways and their nodes stay out of the file.
        lines = self._lines_only(way_ids, way_tags, member_ways)
        extractor = FeatureExtractor(self.writer)
        for way_id in sorted(lines):
            extractor.line(
                way_id, line_features(way_tags[way_id]), line_coords(located.get(nid) for nid in refs.get(way_id, []))
            )
        way_ids -= lines
        if not way_ids and not relations:
            return False
        nodes = {nid for way_id in way_ids for nid in refs.get(way_id, []) if nid in located}
        writer = osmium.SimpleWriter(str(path))
        try:
            for nid in sorted(nodes):
                writer.add_node(osmium.osm.mutable.Node(id=nid, location=located[nid], version=1))
            for way_id in sorted(way_ids):
                writer.add_way(
                    osmium.osm.mutable.Way(id=way_id, nodes=refs.get(way_id, []), tags=way_tags[way_id], version=1)
                )
            for rel_id in sorted(relations):
                writer.add_relation(
                    osmium.osm.mutable.Relation(id=rel_id, members=members[rel_id], tags=relations[rel_id], version=1)
                )
        finally:
            writer.close()
        return True


class _RebuildHandler(osmium.SimpleHandler):
    def __init__(self, writer: render_db.FeatureWriter, ways: set[int], relations: set[int]) -> None:
        super().__init__()
        self.features = FeatureExtractor(
            writer, wanted=lambda t, i: (t == "w" and i in ways) or (t == "r" and i in relations)
        )

    def way(self, w: osmium.osm.Way) -> None:
        self.features.way(w)

    def area(self, a: osmium.osm.Area) -> None:
        self.features.area(a)


def apply_osc(
    store_dir: Path,
    osc_path: Path,
    *,
    sequence: int | None = None,
    sha256: str | None = None,
    commit_if: Callable[[], bool] | None = None,
    connection: sqlite3.Connection | None = None,
) -> dict[str, int]:
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
        if not render_db.attach_geometry(conn, db):
            raise RenderStoreError(
                f"{store_dir}: no geometry store beside the rendering store "
                f"({GEOMETRY_DIR}/{GEOMETRY_DB}); import the extract with toposm-import"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            if already_applied(conn, sequence, sha256):
                conn.execute("ROLLBACK")
                return {"skipped": 1}
            check_in_step(conn, store_dir)
            applier = _DiffApplier(conn)
            ids, applied_positions = diff_plan(osc_path)
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
