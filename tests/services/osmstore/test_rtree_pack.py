"""The packed R*Tree (rtree_pack) against one SQLite builds by inserting: valid, the same rows and answers, and
SQLite's own code updates it afterwards."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from services.osmstore.rtree_pack import pack_rtree

_WINDOW = "SELECT pkid FROM t WHERE xmax >= ? AND xmin <= ? AND ymax >= ? AND ymin <= ? ORDER BY pkid"


def _rtree() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING rtree(pkid, xmin, xmax, ymin, ymax)")
    return conn


@pytest.mark.parametrize("count", [0, 1, 35, 36, 1225, 1226, 20_000])  # 35 cells a node: one leaf, two, depth 2, 3
def test_packed_equals_inserted(count: int) -> None:
    rng = np.random.default_rng(count)
    x, y = rng.uniform(-2e7, 2e7, count), rng.uniform(-2e7, 2e7, count)
    boxes = np.stack([x, x + rng.uniform(0, 1e4, count), y, y + rng.uniform(0, 1e4, count)], axis=1)
    ids = np.arange(1, count + 1)
    inserted, packed = _rtree(), _rtree()
    inserted.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", zip(ids.tolist(), *boxes.T.tolist(), strict=True))
    pack_rtree(packed, "t", count, [(ids[i : i + 7000], boxes[i : i + 7000]) for i in range(0, count, 7000)])
    assert packed.execute("SELECT rtreecheck('t')").fetchone() == ("ok",)
    assert sorted(packed.execute("SELECT * FROM t")) == sorted(inserted.execute("SELECT * FROM t"))  # same floats
    for qx, qy, size in zip(
        rng.uniform(-2e7, 2e7, 30), rng.uniform(-2e7, 2e7, 30), rng.uniform(1e3, 1e6, 30), strict=True
    ):
        window = (qx, qx + size, qy, qy + size)
        assert packed.execute(_WINDOW, window).fetchall() == inserted.execute(_WINDOW, window).fetchall()
    packed.execute("DELETE FROM t WHERE pkid % 3 = 0")
    packed.executemany("INSERT INTO t VALUES (?, 0, 1, 0, 1)", [(count + i,) for i in range(1, 500)])
    assert packed.execute("SELECT rtreecheck('t')").fetchone() == ("ok",)
    assert packed.execute("SELECT count(*) FROM t").fetchone() == (count - count // 3 + 499,)


def test_only_an_empty_tree_is_packed() -> None:
    conn = _rtree()
    conn.execute("INSERT INTO t VALUES (1, 0, 1, 0, 1)")
    with pytest.raises(ValueError, match="not empty"):
        pack_rtree(conn, "t", 1, [])
