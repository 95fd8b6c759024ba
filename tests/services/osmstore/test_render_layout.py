"""How the rendering store lays features out so that a render does not grow with the store (goal
5): the sea cut on a grid, and the feature tables in space order."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from services.osmstore.coastline import SEA_CELL, SEA_PIECE_VERTICES, split_ring
from services.osmstore.render_cluster import z_order
from services.osmstore.render_db import FEATURE_TABLES
from services.osmstore.wkb import bbox_of, ring_area
from tests.services.osmstore.conftest import index_entry


def _cells(low: float, high: float) -> int:
    """Grid cells a span covers (one that ends on a grid line does not reach into the next cell)."""
    return math.ceil(high / SEA_CELL - 1e-9) - math.floor(low / SEA_CELL + 1e-9)


def test_the_sea_is_cut_into_pieces_a_metatile_reads_alone() -> None:
    # A concave ring (a seven-pointed star) ~30 cells across, 2,000 vertices.
    steps = [2 * math.pi * i / 2000 for i in range(2000)]
    ring = [
        (
            2.77e6 + 1.5e5 * (0.6 + 0.4 * math.sin(7 * t)) * math.cos(t),
            8.43e6 + 1.5e5 * (0.6 + 0.4 * math.sin(7 * t)) * math.sin(t),
        )
        for t in steps
    ]
    ring.append(ring[0])
    pieces = split_ring(ring)
    assert len(pieces) > 20
    assert sum(ring_area(p) for p in pieces) == pytest.approx(ring_area(ring), rel=1e-9)  # nothing lost or doubled
    for piece in pieces:
        minx, miny, maxx, maxy = bbox_of(piece)
        assert (_cells(minx, maxx) <= 1 and _cells(miny, maxy) <= 1) or len(piece) <= SEA_PIECE_VERTICES


def test_features_are_stored_in_space_order(imported_store: Path) -> None:
    db = sqlite3.connect(imported_store / "render.sqlite")
    for table in FEATURE_TABLES:
        boxes = np.array(
            db.execute(
                f"SELECT pkid, xmin, xmax, ymin, ymax FROM idx_{table}_geom "  # noqa: S608
                "ORDER BY pkid"
            ).fetchall(),
            np.float64,
        ).reshape(-1, 5)
        keys = z_order((boxes[:, 1] + boxes[:, 2]) / 2, (boxes[:, 3] + boxes[:, 4]) / 2)
        assert np.all(keys[1:] >= keys[:-1]), table
        assert db.execute(f"SELECT rtreecheck('idx_{table}_geom')").fetchone() == ("ok",), table  # packed: valid


def test_every_index_box_is_its_geometrys_box_on_the_grid(imported_store: Path) -> None:
    """``wkb_bbox`` reads back the box the import gave each feature (points, lines, multipolygons, with holes
    among them), and the index keeps it rounded out to the grid: what a diff compares to leave an unchanged
    index box alone."""
    db = sqlite3.connect(imported_store / "render.sqlite")
    shapes: set[int] = set()
    holes = 0
    for table in FEATURE_TABLES:
        for geom, *stored in db.execute(
            f"SELECT t.geom, i.xmin, i.ymin, i.xmax, i.ymax FROM {table} t "  # noqa: S608
            f"JOIN idx_{table}_geom i ON i.pkid = t.fid"
        ):
            assert stored == index_entry(geom), table
            shapes.add(int.from_bytes(geom[1:5], "little"))
            holes += geom[1] == 6 and int.from_bytes(geom[14:18], "little") > 1  # the first polygon's rings
    assert shapes == {1, 2, 6} and holes > 0
