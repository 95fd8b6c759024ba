"""Sea polygons for an extract, from its ``natural=coastline`` ways.

OSM maps no sea area: the sea is whatever lies on the right of the coastline. For a regional extract we
chain the coastline ways, clip them at the extract's box (their nodes outside it are missing), and close
each chain along the box edge, walking clockwise to the next chain's start, exactly how a shoreline tool
closes open coastlines in a bounded region. The result goes into the ``water`` table as ``kind='sea'``
features with ``osm_type='c'``, cut on a grid of z12 tiles (``split_ring``): one ring can follow a whole
country's coast, and a metatile would read all of it.

The import builds the sea. A diff that touches a coastline way only marks it stale (``sea_stale`` in the
store's meta, in the diff's transaction), and ``refresh_sea`` rebuilds it afterwards, beside the diffs
(the Spark bridge runs it in the background after such a diff, then expires that diff's tiles again):
the sea is computed from the whole coastline, which grows with the store, so inside the diff it made a
diff cost what the store weighs, as water polygons are refreshed apart from the minutely
updates on OSM's own tile servers. ``python -m services.osmstore.coastline STORE`` runs it.
"""

from __future__ import annotations

import json
import math
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

from .render_db import GEOMETRY, RENDER_DB, FeatureWriter, attach_geometry, connect, get_meta
from .wkb import BBox, Coord, bbox_of, mercator, mercator_points, multipolygon, polygons_area

SEA_TYPE = "c"  # feature osm_type for computed sea polygons
SEA_STALE = "sea_stale"  # meta key a diff that changed the coastline sets (to its diffs_applied count)
# The sea's pieces: a grid of z12 tiles (a z15 metatile is one of them), each piece at most this many vertices
# unless it fits in one cell.
SEA_CELL = 2 * math.pi * 6378137.0 / (1 << 12)
SEA_PIECE_VERTICES = 64


def _chains(ways: list[list[int]]) -> list[list[int]]:
    """Join ways end to start into the longest node sequences (closed rings end where they start)."""
    chains = [list(w) for w in ways if len(w) >= 2]
    merged = True
    while merged:
        merged = False
        by_start = {c[0]: c for c in chains if c[0] != c[-1]}
        for c in chains:
            nxt = by_start.get(c[-1])
            if nxt is not None and nxt is not c and c[0] != c[-1]:
                c.extend(nxt[1:])
                chains.remove(nxt)
                merged = True
                break
    return chains


def _perimeter_position(p: Coord, box: BBox) -> float:
    """Distance clockwise along the box edge from its top-left corner to p's nearest edge point."""
    minx, miny, maxx, maxy = box
    w, h = maxx - minx, maxy - miny
    x, y = min(max(p[0], minx), maxx), min(max(p[1], miny), maxy)
    edges = [
        (maxy - y, x - minx),
        (maxx - x, w + (maxy - y)),
        (y - miny, w + h + (maxx - x)),
        (x - minx, 2 * w + h + (y - miny)),
    ]  # (distance to edge, position) for top, right, bottom, left
    return min(edges)[1]


def _perimeter_point(t: float, box: BBox) -> Coord:
    minx, miny, maxx, maxy = box
    w, h = maxx - minx, maxy - miny
    t %= 2 * (w + h)
    if t <= w:
        return minx + t, maxy
    if t <= w + h:
        return maxx, maxy - (t - w)
    if t <= 2 * w + h:
        return maxx - (t - w - h), miny
    return minx, miny + (t - 2 * w - h)


def sea_polygons(lines: list[list[Coord]], box: BBox) -> list[list[Coord]]:
    """Close open coastline lines (water on their right) into sea rings along ``box``."""
    perimeter = 2 * ((box[2] - box[0]) + (box[3] - box[1]))
    corners = [0.0, box[2] - box[0], perimeter / 2, perimeter / 2 + box[2] - box[0]]
    open_lines = [ln for ln in lines if len(ln) >= 2 and ln[0] != ln[-1]]
    starts = sorted((_perimeter_position(ln[0], box), i) for i, ln in enumerate(open_lines))
    rings, used = [], set()
    for first in range(len(open_lines)):
        if first in used:
            continue
        ring: list[Coord] = []
        i = first
        while i not in used:
            used.add(i)
            ring.extend(open_lines[i])
            t_end = _perimeter_position(open_lines[i][-1], box)
            ring.append(_perimeter_point(t_end, box))
            # the next chain start clockwise from here (wrapping around the box)
            ahead = [(t - t_end) % perimeter for t, _ in starts]
            nxt = starts[min(range(len(starts)), key=lambda k: ahead[k])]
            t_next = nxt[0]
            span = (t_next - t_end) % perimeter
            passed = sorted((c - t_end) % perimeter for c in corners)
            ring.extend(_perimeter_point(t_end + d, box) for d in passed if 0 < d < span)
            ring.append(_perimeter_point(t_next, box))
            i = nxt[1]
        ring.append(ring[0])
        rings.append(ring)
    return rings


_NODES_PER_QUERY = 500  # ids per IN (...), well under SQLite's variable limit


Locate = Callable[[list[int]], dict[int, Coord]]  # node ids -> Web Mercator points of those found


def sea_rings(extent: str | None, ways: list[list[int]], locate: Locate) -> list[list[Coord]]:
    """The sea rings of the coastline ways ``ways`` (node lists, in id order) within ``extent`` (the store's
    meta: [west, south, east, north] as JSON; no sea without one)."""
    if extent is None:
        return []
    west, south, east, north = json.loads(extent)
    box = (*mercator(west, south), *mercator(east, north))
    chains = _chains(ways)
    located = locate(sorted({nid for chain in chains for nid in chain}))
    # A node outside the extract is not stored: the line is cut at the box there.
    lines = [[located[nid] for nid in chain if nid in located] for chain in chains]
    return sea_polygons(lines, box)


def _stored_sea_rings(conn: sqlite3.Connection) -> list[list[Coord]]:
    """``sea_rings`` of the stored coastline: the ways' tags in this store, their nodes in the geometry
    store (attached: render_db.attach_geometry)."""
    ways = [
        json.loads(nodes)
        for (nodes,) in conn.execute(
            f"SELECT g.nodes FROM ways w JOIN {GEOMETRY}.ways g ON g.id = w.id "  # noqa: S608
            "WHERE json_extract(w.tags, '$.natural') = 'coastline' ORDER BY w.id"
        )
    ]

    def locate(wanted: list[int]) -> dict[int, Coord]:
        located: dict[int, Coord] = {}
        for i in range(0, len(wanted), _NODES_PER_QUERY):
            chunk = wanted[i : i + _NODES_PER_QUERY]
            marks = ", ".join("?" for _ in chunk)
            rows = conn.execute(
                f"SELECT id, lon, lat FROM {GEOMETRY}.nodes WHERE id IN ({marks})",  # noqa: S608
                chunk,
            ).fetchall()
            located.update(
                zip((nid for nid, _, _ in rows), mercator_points([(lon, lat) for _, lon, lat in rows]), strict=True)
            )
        return located

    return sea_rings(get_meta(conn, "extent"), ways, locate)


def _clip(ring: list[Coord], axis: int, at: float, below: bool) -> list[Coord]:
    """The part of a closed ring on one side of the line ``coordinate[axis] = at`` (Sutherland-Hodgman
    against one half-plane), closed again; a concave ring may keep zero-width bridges along the line,
    which a fill does not show."""

    def inside(c: Coord) -> bool:
        return c[axis] <= at if below else c[axis] >= at

    out: list[Coord] = []
    for a, b in zip(ring, ring[1:], strict=False):
        if inside(a):
            out.append(a)
        if inside(a) != inside(b):
            t = (at - a[axis]) / (b[axis] - a[axis])
            cut = (a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t)
            out.append((at, cut[1]) if axis == 0 else (cut[0], at))
    if out and out[0] != out[-1]:
        out.append(out[0])
    return out


def split_ring(ring: list[Coord], cell: float = SEA_CELL) -> list[list[Coord]]:
    """A ring cut on a grid of ``cell`` metres (halves at a grid line, recursively) until each piece lies
    in one cell or has at most SEA_PIECE_VERTICES vertices: a metatile then reads the sea near it, not the
    whole ring (osmcoastline's split water polygons; the coastline layer draws the shore)."""
    if len(ring) < 4:
        return []
    minx, miny, maxx, maxy = bbox_of(ring)
    cells = [(math.floor(low / cell), math.floor(high / cell)) for low, high in ((minx, maxx), (miny, maxy))]
    return _split(ring, cells, cell)


def _split(ring: list[Coord], cells: list[tuple[int, int]], cell: float) -> list[list[Coord]]:
    """``split_ring`` within the cell ranges ``cells`` (first and last cell on each axis)."""
    if len(ring) < 4:
        return []
    axis = 0 if cells[0][1] - cells[0][0] >= cells[1][1] - cells[1][0] else 1
    first, last = cells[axis]
    if len(ring) <= SEA_PIECE_VERTICES or first == last:
        return [ring]
    middle = (first + last + 1) // 2  # the halves' cells: first..middle-1 and middle..last
    below, above = list(cells), list(cells)
    below[axis], above[axis] = (first, middle - 1), (middle, last)
    at = middle * cell
    return [*_split(_clip(ring, axis, at, True), below, cell), *_split(_clip(ring, axis, at, False), above, cell)]


def _write_sea(conn: sqlite3.Connection, writer: FeatureWriter, rings: list[list[Coord]]) -> int:
    """Replace the sea features by ``rings``, each split on the grid; returns how many pieces were written."""
    for (fid,) in conn.execute("SELECT fid FROM water WHERE osm_type = ?", (SEA_TYPE,)).fetchall():
        conn.execute("DELETE FROM idx_water_geom WHERE pkid = ?", (fid,))
    conn.execute("DELETE FROM water WHERE osm_type = ?", (SEA_TYPE,))
    written = 0
    for ring in rings:
        for piece in split_ring(ring):
            if len(piece) >= 4:
                writer.add(
                    "water",
                    SEA_TYPE,
                    written,
                    {"kind": "sea", "area": polygons_area([[piece]])},
                    multipolygon([[piece]]),
                    bbox_of(piece),
                )
                written += 1
    return written


def write_sea(conn: sqlite3.Connection, writer: FeatureWriter, ways: list[list[int]], locate: Locate) -> int:
    """Replace the sea features by those of the coastline ``ways``, in the caller's transaction (the import,
    from its own read of the extract); returns how many polygons were written."""
    return _write_sea(conn, writer, sea_rings(get_meta(conn, "extent"), ways, locate))


def refresh_sea(store_dir: Path) -> int | None:
    """Rebuild the sea of ``store_dir``'s rendering store if a diff marked it stale; returns how many
    polygons were written, None when it was not stale.

    The coastline is read in one read transaction and the rings computed outside any, so a diff waits for
    neither; the polygons are written in a short transaction of their own. A diff that changed the
    coastline again meanwhile leaves the mark set (its own refresh follows)."""
    conn = connect(Path(store_dir) / RENDER_DB)
    try:
        if not attach_geometry(conn, Path(store_dir) / RENDER_DB):
            raise FileNotFoundError(f"{store_dir}: no geometry store beside the rendering store")
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("BEGIN")
        stale = get_meta(conn, SEA_STALE)
        rings = _stored_sea_rings(conn) if stale is not None else []
        conn.execute("COMMIT")
        if stale is None:
            return None
        conn.execute("BEGIN IMMEDIATE")
        written = _write_sea(conn, FeatureWriter(conn), rings)
        if get_meta(conn, SEA_STALE) == stale:
            conn.execute("DELETE FROM meta WHERE key = ?", (SEA_STALE,))
        conn.execute("COMMIT")
        return written
    finally:
        conn.close()


if __name__ == "__main__":
    print(json.dumps({"sea_polygons": refresh_sea(Path(sys.argv[1]))}))
