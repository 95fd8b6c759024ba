"""Filling an empty SQLite R*Tree bottom up, a node at a time, instead of one insert per row.

SQLite's R*Tree has no bulk load: each insert descends the tree, picks a leaf and splits full nodes (about
14 microseconds a row for the import's features, most of building the rendering store's indexes). The
import has its features sorted along a space-filling curve already (``render_cluster``), so it packs them
the way packed R-trees are built (Kamel and Faloutsos' Hilbert-packed R-tree; GDAL bulk-loads GeoPackage
R*Trees by writing their tables the same way): consecutive boxes fill a leaf, consecutive leaves a parent,
up to one root. The tree is written in SQLite's own R*Tree format (its documented shadow tables:
``%_node`` blobs of big-endian cells, ``%_parent``, ``%_rowid``), so SQLite's R*Tree code reads it and
updates it afterwards (diffs) as if it had built it; ``rtreecheck`` validates it (tests).

Node layout (sqlite/ext/rtree/rtree.c): 2 bytes tree depth (root only), 2 bytes cell count, then cells of
an 8-byte id (the row's id in a leaf, the child's node number above) and, per dimension, a 32-bit float
minimum and maximum, big-endian. Every node is as long as the root node SQLite created. Coordinates are
stored as SQLite stores them: 32-bit floats rounded outwards (``as_stored``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from .bulk_sqlite import insert_columns

_CELL = np.dtype([("id", ">i8"), ("box", ">f4", (4,))])  # xmin, xmax, ymin, ymax
_HEADER = 4
FILL = 0.7


def as_stored(values: npt.NDArray[np.float64], up: bool) -> npt.NDArray[np.float32]:
    """Coordinates as the R*Tree keeps them: 32-bit floats, rounded outwards the way SQLite's rtree does
    (minima down, maxima up: a float on the wrong side is recomputed from the value scaled by 1 -/+ 2**-23)."""
    stored = values.astype(np.float32)
    off = stored < values if up else stored > values
    toward_zero = (values[off] < 0) == up  # a minimum above zero and a maximum below it move towards zero
    scale = np.where(toward_zero, 1.0 - 2.0**-23, 1.0 + 2.0**-23)
    stored[off] = (values[off] * scale).astype(np.float32)
    return stored


class _Level:
    """The nodes of one level of the tree being written: their numbers and bounding boxes."""

    def __init__(self) -> None:
        self.nodes: list[npt.NDArray[np.int64]] = []
        self.boxes: list[npt.NDArray[np.float32]] = []

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        if not self.nodes:
            return np.zeros(0, np.int64), np.zeros((0, 4), np.float32)
        return np.concatenate(self.nodes), np.concatenate(self.boxes)


class RTreePacker:
    """Writes the R*Tree ``name`` (empty, 2 dimensions, 32-bit float) from (ids, boxes) batches given in
    the order the leaves are to hold them; ``finish`` writes the levels above the leaves and the root."""

    def __init__(self, conn: sqlite3.Connection, name: str, count: int) -> None:
        self.conn, self.name, self.count = conn, name, count
        (size,) = conn.execute(f'SELECT length(data) FROM "{name}_node" WHERE nodeno = 1').fetchone()  # noqa: S608
        if conn.execute(f'SELECT count(*) FROM "{name}_rowid"').fetchone()[0]:  # noqa: S608
            raise ValueError(f"{name} is not empty")
        self.node_size = int(size)
        # Nodes filled to FILL of what they hold, as index builds leave room (PostGIS's GiST: fillfactor
        # 90): full nodes split at a diff's first insert into them, and a diff on a fully packed store took
        # longer than on one built by inserts (docs/performance.md, "The OSM pipeline at scale: a diff end to end").
        self.per_node = max(2, int((self.node_size - _HEADER) // _CELL.itemsize * FILL))
        self.next_node = 2  # 1 is the root
        self.leaves = _Level()
        self._ids: list[npt.NDArray[np.int64]] = []
        self._boxes: list[npt.NDArray[np.float32]] = []
        self._pending = 0

    def add(self, ids: npt.NDArray[np.int64], boxes: npt.NDArray[np.float64]) -> None:
        """Rows with their boxes (n x 4 float64: xmin, xmax, ymin, ymax), next in leaf order."""
        stored = np.empty(boxes.shape, np.float32)
        for column, up in enumerate((False, True, False, True)):
            stored[:, column] = as_stored(boxes[:, column], up)
        self._ids.append(ids.astype(np.int64))
        self._boxes.append(stored)
        self._pending += len(ids)
        if self._pending >= 64 * self.per_node:
            self._write_leaves(final=False)

    def _write_leaves(self, final: bool) -> None:
        if not self._ids:
            return
        ids, boxes = np.concatenate(self._ids), np.concatenate(self._boxes)
        full = len(ids) if final else len(ids) - len(ids) % self.per_node
        self._ids, self._boxes = [ids[full:]], [boxes[full:]]
        self._pending = len(ids) - full
        if full == 0:
            return
        if self.count <= self.per_node:  # one leaf: the root itself
            self._write_root(ids[:full], boxes[:full], depth=0)
            return
        nodes = self._write_nodes(ids[:full], boxes[:full], self.leaves)
        # Many rows per statement (bulk_sqlite): one per row was a third of packing the tree.
        insert_columns(
            self.conn,
            f'INSERT INTO "{self.name}_rowid" (rowid, nodeno)',  # noqa: S608
            [ids[:full].tolist(), np.repeat(nodes, self.per_node)[:full].tolist()],
        )

    def _write_nodes(
        self, ids: npt.NDArray[np.int64], boxes: npt.NDArray[np.float32], level: _Level
    ) -> npt.NDArray[np.int64]:
        """Non-root nodes holding the cells (ids, boxes) in order, per_node each; returns each cell's node
        number per node and records the nodes in ``level``."""
        count = -(-len(ids) // self.per_node)
        nodes = np.arange(self.next_node, self.next_node + count, dtype=np.int64)
        self.next_node += count
        data = self._blobs(ids, boxes, count)
        self.conn.executemany(
            f'INSERT INTO "{self.name}_node" (nodeno, data) VALUES (?, ?)',  # noqa: S608
            zip(nodes.tolist(), (row.tobytes() for row in data), strict=True),
        )
        # Each node's box: the union of its cells' boxes (min of minima, max of maxima).
        starts = np.arange(0, len(ids), self.per_node)
        mbr = np.empty((count, 4), np.float32)
        mbr[:, 0] = np.minimum.reduceat(boxes[:, 0], starts)
        mbr[:, 1] = np.maximum.reduceat(boxes[:, 1], starts)
        mbr[:, 2] = np.minimum.reduceat(boxes[:, 2], starts)
        mbr[:, 3] = np.maximum.reduceat(boxes[:, 3], starts)
        level.nodes.append(nodes)
        level.boxes.append(mbr)
        return nodes

    def _blobs(self, ids: npt.NDArray[np.int64], boxes: npt.NDArray[np.float32], count: int) -> npt.NDArray[np.uint8]:
        """``count`` node blobs (rows of node_size bytes) holding the cells in order, depth bytes zero."""
        cells = np.zeros(count * self.per_node, _CELL)
        cells["id"][: len(ids)] = ids
        cells["box"][: len(ids)] = boxes
        data = np.zeros((count, self.node_size), np.uint8)
        sizes = np.full(count, self.per_node, dtype=">u2")
        sizes[-1] = len(ids) - (count - 1) * self.per_node
        data[:, 2:4] = sizes.view(np.uint8).reshape(count, 2)
        cell_bytes = self.per_node * _CELL.itemsize
        data[:, _HEADER : _HEADER + cell_bytes] = cells.view(np.uint8).reshape(count, cell_bytes)
        return data

    def _write_root(self, ids: npt.NDArray[np.int64], boxes: npt.NDArray[np.float32], depth: int) -> None:
        data = self._blobs(ids, boxes, 1)
        data[0, 0:2] = np.array([depth], ">u2").view(np.uint8)
        self.conn.execute(
            f'UPDATE "{self.name}_node" SET data = ? WHERE nodeno = 1',  # noqa: S608
            (data[0].tobytes(),),
        )
        if depth == 0:
            insert_columns(
                self.conn,
                f'INSERT INTO "{self.name}_rowid" (rowid, nodeno)',  # noqa: S608
                [ids.tolist(), [1] * len(ids)],
            )

    def finish(self) -> None:
        self._write_leaves(final=True)
        if self.count <= self.per_node:
            return
        level, depth = self.leaves, 1
        while True:
            children, boxes = level.arrays()
            if len(children) <= self.per_node:
                self._write_root(children, boxes, depth)
                parents = np.ones(len(children), np.int64)
            else:
                level = _Level()
                parents = np.repeat(self._write_nodes(children, boxes, level), self.per_node)[: len(children)]
            insert_columns(
                self.conn,
                f'INSERT INTO "{self.name}_parent" (nodeno, parentnode)',  # noqa: S608
                [children.tolist(), parents.tolist()],
            )
            if len(children) <= self.per_node:
                return
            depth += 1


def pack_rtree(
    conn: sqlite3.Connection,
    name: str,
    count: int,
    batches: Iterable[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]],
) -> None:
    """Fill the empty R*Tree ``name`` with ``count`` rows given as (ids, boxes) batches in leaf order."""
    packer = RTreePacker(conn, name, count)
    for ids, boxes in batches:
        packer.add(ids, boxes)
    packer.finish()
