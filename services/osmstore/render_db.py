"""The rendering store's SQLite schema and its writes.

Feature tables hold Web Mercator WKB in ``geom`` and, per table, an R*Tree ``idx_<table>_geom`` whose
``pkid`` is the feature's ``fid``: exactly the spatial index Mapnik's ``sqlite`` plugin looks for, so a tile
query reads only the features in its box. Beside them, ``ways`` and ``relations`` keep each object's tags and
``relation_members`` the members of the relations that can make an area: what a diff update needs beyond
the middle. The middle itself (node locations, each way's node list, the reverse index from a node to its
ways) is the geometry store's (``services.osmstore.geometry``), beside this file in the same store, attached
read-only (``attach_geometry``): osm2pgsql keeps one middle for its outputs, and keeping a second copy here
was half of the import's rows and of the middle's disk (docs/decisions.md, "One middle").

An index box is the feature's box rounded out to a grid (``index_box``), a loose box as physics engines keep
in their dynamic trees (Box2D's "fat" AABBs): a node moved a few metres leaves it as it is, so a diff's
moves rewrite feature rows but seldom the R*Tree, whose every changed entry rewrote a leaf and each node
above it (a large share of the pages a big store's commit wrote: docs/performance.md, "The OSM stores'
design").
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from .geometry import CACHE_KIB as GEOMETRY_CACHE_KIB
from .geometry import GEOMETRY_DB, GEOMETRY_DIR, MMAP_BYTES
from .tags import Attrs
from .wkb import BBox, wkb_bbox

RENDER_DB = "render.sqlite"
FORMAT_VERSION = 2  # 1 kept its own nodes and way_nodes: a second copy of the geometry store's middle
GEOMETRY = "geometry"  # the schema name the geometry store is attached under
# Web Mercator metres the index boxes are rounded out to (``index_box``); recorded in each store's meta as
# ``index_grid`` (a store imported before has none: exact boxes, kept so). 64 m: of a diff's node moves (up to ~20
# m), far fewer change an index box than an exact box (docs/performance.md, "Index boxes on a 64 m grid"); a tile
# query reads features whose box is up to 64 m off its edges (a z17 tile is 306 m across, a z17 metatile 2,446 m).
INDEX_GRID = 64.0
_INDEX_GRID_KEY = "index_grid"

# table -> attribute columns (every feature table also has fid, osm_type, osm_id, geom).
FEATURE_TABLES: dict[str, dict[str, str]] = {
    "roads": {
        "kind": "TEXT",
        "class": "TEXT",
        "name": "TEXT",
        "ref": "TEXT",
        "bridge": "INTEGER",
        "tunnel": "INTEGER",
        "layer": "INTEGER",
        "z_order": "INTEGER",
    },
    "railways": {"kind": "TEXT", "name": "TEXT", "bridge": "INTEGER", "tunnel": "INTEGER", "layer": "INTEGER"},
    "waterways": {"kind": "TEXT", "name": "TEXT", "tunnel": "INTEGER"},
    "coastline": {"kind": "TEXT"},
    "water": {"kind": "TEXT", "name": "TEXT", "area": "REAL"},
    "landuse": {"kind": "TEXT", "name": "TEXT", "area": "REAL"},
    "buildings": {"kind": "TEXT", "name": "TEXT", "housenumber": "TEXT", "area": "REAL"},
    "places": {"kind": "TEXT", "name": "TEXT", "rank": "INTEGER", "population": "INTEGER"},
}

_OSM_TABLES = """
CREATE TABLE ways (id INTEGER PRIMARY KEY, tags TEXT NOT NULL);
CREATE TABLE relations (id INTEGER PRIMARY KEY, tags TEXT NOT NULL);
CREATE TABLE relation_members (relation_id INTEGER NOT NULL, seq INTEGER NOT NULL, member_type TEXT NOT NULL,
                               member_id INTEGER NOT NULL, role TEXT NOT NULL,
                               PRIMARY KEY (relation_id, seq)) WITHOUT ROWID;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Built after the bulk load (faster than maintaining them row by row during import).
_OSM_INDEXES = """
CREATE INDEX relation_members_by_member ON relation_members (member_type, member_id);
"""


def connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN/COMMIT), so a diff is all-or-nothing. A URI,
    # so that ATTACH takes one too (attach_geometry: read-only) whatever SQLite was compiled with.
    conn = sqlite3.connect(Path(path).resolve().as_uri(), uri=True, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")
    return conn


def attach_geometry(conn: sqlite3.Connection, render_db: Path) -> bool:
    """Attach the store's geometry database (``geometry/geometry.sqlite`` beside ``render_db``) read-only as
    ``geometry``, unless it is already; False when the store has none. Read-only: a diff's transaction here
    never locks it (the geometry store's own writer commits it), and reads inside that transaction see one
    committed state of it."""
    if any(row[1] == GEOMETRY for row in conn.execute("PRAGMA database_list")):
        return True
    path = Path(render_db).resolve().parent / GEOMETRY_DIR / GEOMETRY_DB
    if not path.is_file():
        return False
    conn.execute(f"ATTACH DATABASE ? AS {GEOMETRY}", (f"{path.as_uri()}?mode=ro",))
    # Its own page cache (an attached database does not share the main one's size): the upper levels of
    # its B-trees stay in memory from one diff to the next on a kept connection, as for its own readers.
    conn.execute(f"PRAGMA {GEOMETRY}.cache_size = -{GEOMETRY_CACHE_KIB}")
    conn.execute(f"PRAGMA {GEOMETRY}.mmap_size = {MMAP_BYTES}")  # its lookups: geometry.MMAP_BYTES
    return True


def create_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(_OSM_TABLES)
    for table, columns in FEATURE_TABLES.items():
        cols = ", ".join(f'"{c}" {t}' for c, t in columns.items())
        conn.execute(
            f"CREATE TABLE {table} (fid INTEGER PRIMARY KEY, osm_type TEXT NOT NULL, "  # noqa: S608
            f"osm_id INTEGER NOT NULL, {cols}, geom BLOB NOT NULL)"
        )
        conn.execute(f"CREATE VIRTUAL TABLE idx_{table}_geom USING rtree(pkid, xmin, xmax, ymin, ymax)")
    set_meta(conn, "format_version", str(FORMAT_VERSION))
    set_meta(conn, _INDEX_GRID_KEY, repr(INDEX_GRID))


Coordinate = TypeVar("Coordinate", float, npt.NDArray[np.float64])


def index_box(
    minx: Coordinate, miny: Coordinate, maxx: Coordinate, maxy: Coordinate, grid: float
) -> tuple[Coordinate, Coordinate, Coordinate, Coordinate]:
    """A box (numbers, or arrays of boxes) as the R*Tree keeps it: rounded out to multiples of ``grid``
    (none when 0). Multiples of a power of two are exact in the R*Tree's 32-bit floats."""
    if not grid:
        return minx, miny, maxx, maxy
    return (minx // grid * grid, miny // grid * grid, -(-maxx // grid) * grid, -(-maxy // grid) * grid)


def index_grid(conn: sqlite3.Connection) -> float:
    """The grid the store's index boxes are rounded to (``index_box``): 0 for a store imported before."""
    value = get_meta(conn, _INDEX_GRID_KEY)
    return float(value) if value else 0.0


def create_indexes(conn: sqlite3.Connection) -> None:
    """The indexes a diff update looks objects up by, built once the import's rows are in."""
    for statement in _OSM_INDEXES.split(";"):  # not executescript: it would commit the open transaction
        if statement.strip():
            conn.execute(statement)
    for table in FEATURE_TABLES:
        conn.execute(f"CREATE INDEX {table}_by_osm ON {table} (osm_type, osm_id)")


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def get_meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _insert_sql(table: str, columns: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    names = ", ".join('"' + c + '"' for c in columns)
    marks = ", ".join("?" for _ in columns)
    return f"INSERT INTO {table} (osm_type, osm_id, {names}, geom) VALUES (?, ?, {marks}, ?)", columns  # noqa: S608


def _update_sql(table: str, columns: tuple[str, ...]) -> str:
    assignments = ", ".join(f'"{c}" = ?' for c in columns)
    return f"UPDATE {table} SET {assignments}, geom = ? WHERE fid = ?"  # noqa: S608


class FeatureWriter:
    """Inserts and removes rendered features, keeping each table's R*Tree in step."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.grid = index_grid(conn)
        self.written = 0
        self.kept = 0  # features ``add`` found staged as they are (``stage_many``)
        self.rewritten = 0  # staged features ``add`` gave other values in place (counted in ``written`` too)
        # (table, osm_type, osm_id) -> (attribute values..., geom) -> fids: the staged features
        self._staged: dict[tuple[str, str, int], dict[tuple[object, ...], list[int]]] = {}
        self._insert_sql = {table: _insert_sql(table, tuple(columns)) for table, columns in FEATURE_TABLES.items()}
        self._update_sql = {table: _update_sql(table, tuple(columns)) for table, columns in FEATURE_TABLES.items()}
        # (osm_type, osm_id) -> the tables holding its features, for the objects ``preload`` looked up:
        # ``remove`` then deletes from those tables only (most changed nodes have no feature at all, and
        # two statements per table and object were most of a diff's statements).
        self._tables: dict[tuple[str, int], set[str]] = {}

    def preload(self, osm_type: str, osm_ids: list[int]) -> None:
        """Look up in which tables the features of ``osm_ids`` (at most SQLite's variable limit less one) are."""
        for osm_id in osm_ids:
            self._tables.setdefault((osm_type, osm_id), set())
        if not osm_ids:
            return
        marks = ", ".join("?" for _ in osm_ids)
        for table in FEATURE_TABLES:
            for (osm_id,) in self.conn.execute(
                f"SELECT DISTINCT osm_id FROM {table} "  # noqa: S608
                f"WHERE osm_type = ? AND osm_id IN ({marks})",
                (osm_type, *osm_ids),
            ):
                self._tables[(osm_type, osm_id)].add(table)

    def has_features(self, table: str, osm_type: str, osm_id: int) -> bool | None:
        """Whether ``table`` holds a feature of the object; None when it was not preloaded."""
        tables = self._tables.get((osm_type, osm_id))
        return None if tables is None else table in tables

    def add(self, table: str, osm_type: str, osm_id: int, attrs: Attrs, geom: bytes, bbox: BBox) -> None:
        values = (*attribute_values(table, attrs), geom)
        tables = self._tables.get((osm_type, osm_id))
        if tables is not None:
            tables.add(table)
        staged = self._staged.get((table, osm_type, osm_id))
        if staged:
            fids = staged.get(values)
            if fids:  # the same feature as stored: left as it is (its box is the same)
                fids.pop()
                self.kept += 1
                return
            replaced = next(((old, fids) for old, fids in staged.items() if fids), None)
            if replaced is not None:
                self._rewrite(table, replaced[1].pop(), replaced[0], values, bbox)
                return
        cur = self.conn.execute(self._insert_sql[table][0], (osm_type, osm_id, *values))
        minx, miny, maxx, maxy = index_box(*bbox, self.grid)
        self.conn.execute(
            f"INSERT INTO idx_{table}_geom VALUES (?, ?, ?, ?, ?)",  # noqa: S608
            (cur.lastrowid, minx, maxx, miny, maxy),
        )
        self.written += 1

    def _rewrite(self, table: str, fid: int, old: tuple[object, ...], values: tuple[object, ...], bbox: BBox) -> None:
        """A staged feature of the same object made differently: its row takes the new values in place, and
        its index entry changes only when its index box does. A node moved inside a way's box, or by less
        than the grid (``index_box``), then leaves the R*Tree alone: in a big store each R*Tree delete and
        insert rewrote the leaf and every node above it (docs/performance.md, "The OSM stores'
        design")."""
        self.conn.execute(self._update_sql[table], (*values, fid))
        box = index_box(*bbox, self.grid)
        try:
            same_box = isinstance(old[-1], bytes) and index_box(*wkb_bbox(old[-1]), self.grid) == box
        except ValueError:  # not a geometry this code wrote: its entry is written anew
            same_box = False
        if not same_box:
            minx, miny, maxx, maxy = box
            self.conn.execute(
                f"UPDATE idx_{table}_geom SET xmin = ?, xmax = ?, ymin = ?, ymax = ? "  # noqa: S608
                "WHERE pkid = ?",
                (minx, maxx, miny, maxy, fid),
            )
        self.written += 1
        self.rewritten += 1

    def stage_many(self, osm_type: str, osm_ids: list[int]) -> None:
        """Stage the features of objects (of one type, at most SQLite's variable limit less one) whose
        features are made again: until ``drop_staged`` they stay, and one that ``add`` makes again exactly
        (attributes and geometry) is kept with its row and index entry. A tag edit that changes nothing
        drawn then writes nothing; in a big store, each feature deleted and inserted again was a few pages
        of its own (its row, its index entry, R*Tree nodes)."""
        if not osm_ids:
            return
        for osm_id in osm_ids:
            known = self._tables.get((osm_type, osm_id))
            if known is not None:
                known.clear()
        marks = ", ".join("?" for _ in osm_ids)
        for table, columns in FEATURE_TABLES.items():
            names = ", ".join('"' + c + '"' for c in columns)
            for fid, osm_id, *values in self.conn.execute(
                f"SELECT fid, osm_id, {names}, geom FROM {table} "  # noqa: S608
                f"WHERE osm_type = ? AND osm_id IN ({marks})",
                (osm_type, *osm_ids),
            ):
                self._staged.setdefault((table, osm_type, osm_id), {}).setdefault(tuple(values), []).append(fid)

    def drop_staged(self) -> int:
        """Remove the staged features ``add`` did not make again; returns how many went."""
        stale: dict[str, list[int]] = {}
        for (table, _, _), rows in self._staged.items():
            stale.setdefault(table, []).extend(fid for fids in rows.values() for fid in fids)
        self._staged.clear()
        for table, fids in stale.items():
            fids.sort()
            for i in range(0, len(fids), 500):
                chunk = fids[i : i + 500]
                marks = ", ".join("?" for _ in chunk)
                self.conn.execute(f"DELETE FROM idx_{table}_geom WHERE pkid IN ({marks})", chunk)  # noqa: S608
                self.conn.execute(f"DELETE FROM {table} WHERE fid IN ({marks})", chunk)  # noqa: S608
        return sum(map(len, stale.values()))

    def remove(self, osm_type: str, osm_id: int) -> int:
        """Drop every feature made from one OSM object; returns how many went."""
        removed = 0
        known = self._tables.get((osm_type, osm_id))
        for table in [t for t in FEATURE_TABLES if known is None or t in known]:
            self.conn.execute(
                f"DELETE FROM idx_{table}_geom WHERE pkid IN "  # noqa: S608
                f"(SELECT fid FROM {table} WHERE osm_type = ? AND osm_id = ?)",
                (osm_type, osm_id),
            )
            removed += self.conn.execute(
                f"DELETE FROM {table} WHERE osm_type = ? AND osm_id = ?",  # noqa: S608
                (osm_type, osm_id),
            ).rowcount
        if known is not None:
            known.clear()
        return removed


def attribute_values(table: str, attrs: Attrs) -> tuple[object, ...]:
    """The attribute columns of ``table`` (FEATURE_TABLES order) from ``attrs``."""
    return tuple(attrs.get(c) for c in FEATURE_TABLES[table])


def tags_json(tags: Iterable[tuple[str, str]] | Mapping[str, str]) -> str:
    items = tags.items() if isinstance(tags, Mapping) else tags
    return json.dumps(dict(items), ensure_ascii=False, separators=(",", ":"))


def feature_counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in FEATURE_TABLES}  # noqa: S608
