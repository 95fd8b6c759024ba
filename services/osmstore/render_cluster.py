"""The rendering store's features stored in space order, as osm2pgsql clusters its tables by geometry.

A feature table is a B-tree in ``fid`` order, and the import hands out fids in the order of the OSM ids,
which in a country extract interleave every part of the country: a metatile's few thousand features then
sit on a few thousand pages, one each, where the same features of a city extract share a few hundred
(issue 22, goal 5: K copies of a city, ids interleaved, rendered 10-35 ms slower per metatile at K=200 than
at K=1, with the same features in view). Once the import has written them, each table is rewritten with
fids in the Z-order (Morton) of the features' box centres, and its R*Tree with it, so the rows a metatile
reads are neighbours on disk and in the page cache. Features a diff adds later go to the end, as rows
updated in PostGIS go wherever there is room; a store re-imported is clustered again.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import numpy.typing as npt

from .render_db import FEATURE_TABLES

_HALF_WORLD = 20037508.342789244  # Web Mercator's half width (metres)
_GRID_BITS = 24  # cells per axis of the Z-order: ~2.4 m at the equator
_SPREAD = ((16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F),
           (2, 0x3333333333333333), (1, 0x5555555555555555))


def _spread(value: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Zeros between the bits of ``value`` (the Morton "part1by1")."""
    for shift, mask in _SPREAD:
        value = (value | (value << np.uint64(shift))) & np.uint64(mask)
    return value


def z_order(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> npt.NDArray[np.uint64]:
    top = (1 << _GRID_BITS) - 1
    gx = np.clip((x + _HALF_WORLD) / (2 * _HALF_WORLD) * (1 << _GRID_BITS), 0, top).astype(np.uint64)
    gy = np.clip((_HALF_WORLD - y) / (2 * _HALF_WORLD) * (1 << _GRID_BITS), 0, top).astype(np.uint64)
    return _spread(gx) | (_spread(gy) << np.uint64(1))


def cluster_features(conn: sqlite3.Connection) -> None:
    """Rewrite every feature table (and its R*Tree and indexes) in space order, in the caller's transaction."""
    for table in FEATURE_TABLES:
        _cluster(conn, table)


def _cluster(conn: sqlite3.Connection, table: str) -> None:
    boxes = conn.execute(f"SELECT pkid, xmin, xmax, ymin, ymax FROM idx_{table}_geom").fetchall()  # noqa: S608
    if not boxes:
        return
    rows = np.array(boxes, np.float64)
    order = np.argsort(z_order((rows[:, 1] + rows[:, 2]) / 2, (rows[:, 3] + rows[:, 4]) / 2), kind="stable")
    old_fids = rows[order, 0].astype(np.int64).tolist()
    conn.execute("CREATE TEMP TABLE cluster_fids (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
    conn.executemany("INSERT INTO cluster_fids (old, new) VALUES (?, ?)",
                     ((old, new) for new, old in enumerate(old_fids, start=1)))
    ddl = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0]
    indexes = [sql for (sql,) in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
                                              "AND sql IS NOT NULL", (table,))]
    columns = ", ".join(f'"{c}"' for (_, c, *_) in conn.execute(f"PRAGMA table_info({table})") if c != "fid")
    conn.execute(ddl.replace(f"CREATE TABLE {table}", f"CREATE TABLE {table}_clustered", 1))
    conn.execute(f"INSERT INTO {table}_clustered (fid, {columns}) SELECT m.new, {columns} "  # noqa: S608
                 f"FROM cluster_fids m JOIN {table} t ON t.fid = m.old ORDER BY m.new")
    new_boxes = [(new, *boxes[i][1:]) for new, i in enumerate(order.tolist(), start=1)]
    conn.execute(f"DELETE FROM idx_{table}_geom")  # noqa: S608
    conn.executemany(f"INSERT INTO idx_{table}_geom (pkid, xmin, xmax, ymin, ymax) VALUES (?, ?, ?, ?, ?)",  # noqa: S608
                     new_boxes)
    conn.execute(f"DROP TABLE {table}")
    conn.execute(f"ALTER TABLE {table}_clustered RENAME TO {table}")
    for sql in indexes:
        conn.execute(sql)
    conn.execute("DROP TABLE cluster_fids")
