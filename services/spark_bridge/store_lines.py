"""The old and new lines of a diff's changed ways as points and segments, in arrays (store_expire).

Each side (old: stored refs and stored locations; new: the diff's refs and locations where it has them,
else the stored ones) is a table of vertices ``(way, seq, node)``. A vertex is located through a table
of known locations; consecutive ``seq`` of one way with both nodes located make a segment (a node
without location breaks the line there), and a located vertex that starts no segment is a point of its
own. This ran as a Python loop per (side, way) with a sort each; arrays make a diff's whole resolution on the
driver faster (docs/performance.md, "Store lookups on the driver when small"), and the rendering store's
child, the job's longest part, gets the CPU it no longer uses.

The figures stay those of the loop: tile positions come from ``np_frac_tile`` (``py_frac_tile``'s
expressions over arrays, once per location), and the sample count per segment is the same IEEE arithmetic
as ``sample_steps`` (subtraction, abs, division, ceil, max), so ``most_way_samples`` and the per-geometry
guard are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from services.spark_bridge.tile_columns import WAY_SAMPLE_STEP, np_frac_tile

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Location = tuple[float, float]


class Locations:
    """Node id -> location (and its fractional tile position at ``zoom``), looked up a whole array at once;
    a location of NaN means the node has none (deleted, or unknown to the diff and the store)."""

    def __init__(self, ids: Ints, lon: Floats, lat: Floats, zoom: int) -> None:
        order = np.argsort(ids, kind="stable")
        self.size = len(ids)
        # One row more, never matched (``index`` says so): a lookup may gather from row ``size`` safely.
        self.ids = np.append(ids[order], 0)
        self.lon, self.lat = np.append(lon[order], np.nan), np.append(lat[order], np.nan)
        self.fx, self.fy = np_frac_tile(self.lon, self.lat, zoom)  # NaN stays NaN

    def index(self, nodes: Ints) -> tuple[Ints, npt.NDArray[np.bool_]]:
        """(row of each node in this table, whether it is there at all)."""
        at = np.searchsorted(self.ids[: self.size], nodes)
        return at, (at < self.size) & (self.ids[at] == nodes)


@dataclass
class Side:
    """The vertices of one side: ``(way, seq, node)`` rows, and where to locate the nodes: ``first``
    wins where it has the node (even without a location: a deleted node), else ``then``."""

    way: Ints
    seq: Ints
    node: Ints
    first: Locations
    then: Locations | None = None

    def located(self) -> tuple[Ints, Ints, Floats, Floats, Floats, Floats]:
        """(way, seq, lon, lat, fx, fy) of every located vertex, sorted by way, then seq."""
        at, found = self.first.index(self.node)
        lon, lat = np.where(found, self.first.lon[at], np.nan), np.where(found, self.first.lat[at], np.nan)
        fx, fy = np.where(found, self.first.fx[at], np.nan), np.where(found, self.first.fy[at], np.nan)
        if self.then is not None:
            at2, found2 = self.then.index(self.node)
            use = ~found & found2
            lon, lat = np.where(use, self.then.lon[at2], lon), np.where(use, self.then.lat[at2], lat)
            fx, fy = np.where(use, self.then.fx[at2], fx), np.where(use, self.then.fy[at2], fy)
        ok = ~(np.isnan(lon) | np.isnan(lat))
        order = np.lexsort((self.seq[ok], self.way[ok]))
        return (self.way[ok][order], self.seq[ok][order], lon[ok][order], lat[ok][order], fx[ok][order], fy[ok][order])


@dataclass
class Lines:
    segments: Floats  # (n, 4) rows lon0, lat0, lon1, lat1, each once
    points: Floats  # (n, 2) rows lon, lat, each once
    most_samples: int  # sample points of the longest (side, way): bounds the tiles one way can expire


def _distinct(rows: Floats) -> Floats:
    return np.unique(rows, axis=0) if len(rows) > 1 else rows


def _as_keys(points: Floats) -> npt.NDArray[np.complex128]:
    """Each (lon, lat) row as one comparable value (its two doubles, bit for bit)."""
    return np.ascontiguousarray(points, np.float64).view(np.complex128).ravel()


def lines(sides: list[Side]) -> Lines:
    """Points and segments of every side's ways, each once (an unchanged line is the same on its old and
    new side; duplicates would only be sampled and deduplicated again)."""
    segments: list[Floats] = [np.zeros((0, 4))]
    points: list[Floats] = [np.zeros((0, 2))]
    most = 0
    for side in sides:
        way, seq, lon, lat, fx, fy = side.located()
        starts = np.zeros(len(way), np.bool_)
        if len(way) > 1:
            starts[:-1] = (way[1:] == way[:-1]) & (seq[1:] == seq[:-1] + 1)
        begin = np.flatnonzero(starts)
        end = begin + 1
        segments.append(np.column_stack([lon[begin], lat[begin], lon[end], lat[end]]))
        # A vertex that starts a segment is that segment's first sample already (exactly: the sample at
        # t=0 is the vertex itself), so only the others are points of their own.
        points.append(np.column_stack([lon[~starts], lat[~starts]]))
        if len(begin):
            longest = np.maximum(np.abs(fx[end] - fx[begin]), np.abs(fy[end] - fy[begin]))
            steps = np.maximum(np.ceil(longest / WAY_SAMPLE_STEP), 1.0)
            _, group = np.unique(way[begin], return_inverse=True)
            most = max(most, int(np.bincount(group, weights=steps + 1.0).max()))
    return Lines(_distinct(np.concatenate(segments)), _distinct(np.concatenate(points)), most)


def segments_table(found: Lines, extra_points: set[Location]) -> pa.Table:
    """Segments, and every point that starts none as a segment of length zero (its samples are the point):
    one table, so the tile math gets one set of rows and one sampling plan."""
    extra = np.array(sorted(extra_points), np.float64).reshape(-1, 2)
    points = _distinct(np.concatenate([found.points, extra]))
    points = points[~np.isin(_as_keys(points), _as_keys(found.segments[:, :2]))]
    columns = np.concatenate([found.segments, np.column_stack([points, points])])
    return pa.table(
        {name: pa.array(columns[:, i], pa.float64()) for i, name in enumerate(("lon0", "lat0", "lon1", "lat1"))}
    )
