"""Resolving the ways of a diff into segments between node locations of the same diff.

This is a dictionary lookup over data that is already on the driver (the parsed diff), so it runs in
plain Python; the per-sample work (sampling, buffering, propagation) stays in Spark. A way with any node
missing from the diff is *unresolved*: reported, never guessed (its nodes that are in the diff still
expire their own tiles as nodes). A node present in several versions is where the reader's version rule
puts it (``OscTables.latest_locations``).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import pyarrow as pa

from services.spark_bridge.osc_reader import OscTables
from services.spark_bridge.tile_columns import WAY_SAMPLE_STEP, py_frac_tile

BUFFERED_TILES_PER_SAMPLE = 4  # a sample plus its 0.1-tile buffer touches at most 2x2 tiles


class ExpireTooLarge(RuntimeError):
    """A max-tiles guard tripped: the job would expire more tiles than allowed."""


@dataclass
class WaySegments:
    lon0: array = field(default_factory=lambda: array("d"))
    lat0: array = field(default_factory=lambda: array("d"))
    lon1: array = field(default_factory=lambda: array("d"))
    lat1: array = field(default_factory=lambda: array("d"))
    unresolved: list[int] = field(default_factory=list)
    resolved: int = 0
    samples: int = 0  # sample points of every resolved way: bounds the tiles they can expire

    def table(self) -> pa.Table:
        return pa.table(
            {
                "lon0": pa.array(self.lon0, pa.float64()),
                "lat0": pa.array(self.lat0, pa.float64()),
                "lon1": pa.array(self.lon1, pa.float64()),
                "lat1": pa.array(self.lat1, pa.float64()),
            }
        )


def sample_steps(fx0: float, fy0: float, fx1: float, fy1: float) -> int:
    """Intervals a segment is cut into so consecutive samples are <= WAY_SAMPLE_STEP tile apart."""
    return max(math.ceil(max(abs(fx1 - fx0), abs(fy1 - fy0)) / WAY_SAMPLE_STEP), 1)


def resolve_ways(osc: OscTables, zoom: int, max_tiles_per_geometry: int) -> WaySegments:
    latest = osc.latest_locations()
    out = WaySegments(unresolved=list(osc.ways_without_nodes))
    for way_id, refs in osc.ways:
        located = [latest.get(ref) for ref in refs]
        if any(loc is None for loc in located):
            out.unresolved.append(way_id)
            continue
        coords = [loc for loc in located if loc is not None]
        frac = [py_frac_tile(lon, lat, zoom) for lon, lat in coords]
        samples = sum(sample_steps(*a, *b) + 1 for a, b in zip(frac, frac[1:], strict=False))
        if samples * BUFFERED_TILES_PER_SAMPLE > max_tiles_per_geometry:
            raise ExpireTooLarge(
                f"way {way_id} would expire up to {samples * BUFFERED_TILES_PER_SAMPLE} tiles at z{zoom}, "
                f"over max_tiles_per_geometry={max_tiles_per_geometry}"
            )
        out.resolved += 1
        out.samples += samples
        for (lon0, lat0), (lon1, lat1) in zip(coords, coords[1:], strict=False):
            out.lon0.append(lon0)
            out.lat0.append(lat0)
            out.lon1.append(lon1)
            out.lat1.append(lat1)
    out.unresolved = sorted(set(out.unresolved))
    return out
