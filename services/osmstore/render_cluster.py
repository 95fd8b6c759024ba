"""The rendering store's features stored in space order, as osm2pgsql clusters its tables by geometry.

A feature table is a B-tree in ``fid`` order, and the import meets features in the order of the OSM ids,
which in a country extract interleave every part of the country: a metatile's few thousand features then
sit on a few thousand pages, one each, where the same features of a city extract share a few hundred
(K copies of a city, ids interleaved, rendered slower per metatile the more copies there were, with the same
features in view: docs/performance.md, "The OSM stores' design"). So the import's
``BulkFeatureWriter`` writes features to staging tables with the Z-order (Morton) key of their box centres,
and ``finish`` moves each table into place in that order, fids counting up along it, and fills its R*Tree the
same way: the rows a metatile reads are neighbours on disk and in the page cache. The staging tables are TEMP
(their own file, gone at close), so the store does not keep their pages as free space, and everything past
binding the rows is SQLite's own copying, not Python. Features a diff adds later go to the end, as rows
updated in PostGIS go wherever there is room; a store re-imported is clustered again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from .bulk_sqlite import insert_columns
from .render_db import FEATURE_TABLES, FeatureWriter, attribute_values, index_box
from .rtree_pack import as_stored, pack_rtree
from .tags import Attrs
from .wkb import BBox

_HALF_WORLD = 20037508.342789244  # Web Mercator's half width (metres)
_GRID_BITS = 24  # cells per axis of the Z-order: ~2.4 m at the equator
_SPREAD = (
    (16, 0x0000FFFF0000FFFF),
    (8, 0x00FF00FF00FF00FF),
    (4, 0x0F0F0F0F0F0F0F0F),
    (2, 0x3333333333333333),
    (1, 0x5555555555555555),
)


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


class BulkFeatureWriter(FeatureWriter):
    """``add`` for the import: rows gathered per table and written many per statement (``flush``) into the
    table's staging table with their box and its Z-order key; ``finish`` puts them in place. Only for a store
    being built, whose feature tables are still empty."""

    def __init__(self, conn: sqlite3.Connection, flush_rows: int = 20_000) -> None:
        super().__init__(conn)
        self.flush_rows = flush_rows
        self._rows: dict[str, list[tuple[object, ...]]] = {table: [] for table in FEATURE_TABLES}
        self._pending = 0
        conn.execute("PRAGMA temp.cache_size = -8192")  # the staging tables are written once, read once in order
        for table, columns in FEATURE_TABLES.items():
            names = ", ".join(f'"{c}"' for c in columns)
            # The box before the geometry: reading it then never walks the geometry's overflow pages.
            conn.execute(
                f"CREATE TEMP TABLE stage_{table} (z INTEGER NOT NULL, xmin, xmax, ymin, ymax, osm_type, "
                f"osm_id, {names}, geom)"
            )

    def add(self, table: str, osm_type: str, osm_id: int, attrs: Attrs, geom: bytes, bbox: BBox) -> None:
        self.add_values(table, osm_type, osm_id, attribute_values(table, attrs), geom, bbox)

    def add_values(
        self, table: str, osm_type: str, osm_id: int, values: tuple[object, ...], geom: bytes, bbox: BBox
    ) -> None:
        """``add`` with the attributes already in column order (``attribute_values``), as the import computes
        them once per distinct tag set."""
        self._rows[table].append((osm_type, osm_id, *values, geom, *bbox))
        self.written += 1
        self._pending += 1
        if self._pending >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        for table, rows in self._rows.items():
            if not rows:
                continue
            columns = list(zip(*rows, strict=True))
            # The key of the box as the R*Tree keeps it, so the store's own boxes give the order (tests).
            x0, y0, x1, y1 = (np.array(c, np.float64) for c in columns[-4:])
            boxes = index_box(x0, y0, x1, y1, self.grid)
            minx, miny, maxx, maxy = (
                as_stored(c, up).astype(np.float64) for c, up in zip(boxes, (False, False, True, True), strict=True)
            )
            z = z_order((minx + maxx) / 2, (miny + maxy) / 2).astype(np.int64).tolist()
            names = ", ".join(f'"{c}"' for c in FEATURE_TABLES[table])
            insert_columns(
                self.conn,
                f"INSERT INTO stage_{table} (z, osm_type, osm_id, {names}, geom, "  # noqa: S608
                "xmin, ymin, xmax, ymax)",
                [z, *columns[:-4], *(c.tolist() for c in boxes)],
            )
            rows.clear()
        self._pending = 0

    def finish(self) -> None:
        """Move every staged feature into its table in Z-order (ties in the order written), fids 1, 2, ...
        along it, and pack the R*Tree in the same order (rtree_pack); in the caller's transaction.

        One statement a table: SQLite's sorter puts the rows in order (in memory up to its budget, then
        merging runs from temporary files: sequential, bounded), and they go in as appends in that order,
        so the table being empty, SQLite numbers them 1, 2, ... (a ``row_number() OVER (ORDER BY ...)`` for
        the fids cost a third more CPU for the same rows: docs/performance.md, "The OSM stores' design").
        Ordering the keys into a table of their own and then fetching each staged row by rowid took as long
        as the sort; a larger budget for the sorter did not help."""
        self.flush()
        for table, columns in FEATURE_TABLES.items():
            names = ", ".join(f'"{c}"' for c in columns)
            count = self.conn.execute(
                f"INSERT INTO main.{table} (osm_type, osm_id, {names}, geom) "  # noqa: S608
                f"SELECT osm_type, osm_id, {names}, geom FROM stage_{table} "
                "ORDER BY z, rowid"
            ).rowcount
            boxes = self.conn.execute(f"SELECT xmin, xmax, ymin, ymax FROM stage_{table} ORDER BY z, rowid")  # noqa: S608
            pack_rtree(self.conn, f"idx_{table}_geom", count, _box_batches(boxes))
            self.conn.execute(f"DROP TABLE stage_{table}")


def _box_batches(rows: sqlite3.Cursor, size: int = 50_000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(xmin, xmax, ymin, ymax) rows in fid order (fids 1, 2, ...) as (ids, boxes) arrays, ``size`` rows at a
    time."""
    first = 1
    while chunk := rows.fetchmany(size):
        boxes = np.array(chunk, np.float64)
        yield np.arange(first, first + len(boxes), dtype=np.int64), boxes
        first += len(boxes)
