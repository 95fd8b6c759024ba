"""A store job's tile math on the driver, when the diff is small: Spark's plan (expire_job), in numpy.

A minutely diff resolves to a few thousand segments (store_expire), already on the driver. Sampling them,
buffering the samples into tiles, propagating the tiles to every zoom and counting them per metatile is
a few hundred thousand array elements: milliseconds in numpy, where Spark's plan for it (two exchanges,
one action) cost most of a minutely diff's time, the same at any store size (the figures: docs/decisions.md,
"A store diff's path end to end"). So a job whose samples fit the driver's budget
(``--driver-lookup-mib``, the same budget as the store lookups: what one step of a store job may hold on
the driver) is expired here, and a bigger one (a merged catch-up diff, a planet's daily diff) in Spark,
exactly as before. ``driver_bytes=0`` forces Spark (tests compare both).

The arithmetic is Spark's, operation for operation (tile_columns: the same IEEE double expressions for the
tile position, ``ceil`` of the Chebyshev length over the sample step, ``i / steps`` along the segment,
``floor`` of the 0.1-tile buffer clamped to the map), so both give the same metatiles and counts (up to
the last bit of sin and log, ``np_frac_tile``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from services.spark_bridge.expire_collect import Collected
from services.spark_bridge.tile_columns import TILE_BUFFER, WAY_SAMPLE_STEP, np_frac_tile
from services.toposm.contract import METATILE_SHIFT

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

# Estimated bytes the driver holds per sample: its position, its 1..4 buffered tiles as keys, and the
# sort scratch of the dedupe (what the driver budget is measured in, as ROW_BYTES for the lookups).
SAMPLE_BYTES = 96


def _steps(segments: pa.Table, zoom: int) -> tuple[Floats, Floats, Floats, Floats, Ints]:
    """Both ends in tile units, and how many intervals each segment is cut into (expire_job.way_samples)."""
    fx0, fy0 = np_frac_tile(segments["lon0"].to_numpy(), segments["lat0"].to_numpy(), zoom)
    fx1, fy1 = np_frac_tile(segments["lon1"].to_numpy(), segments["lat1"].to_numpy(), zoom)
    longest = np.maximum(np.abs(fx1 - fx0), np.abs(fy1 - fy0))
    steps = np.maximum(np.ceil(longest / WAY_SAMPLE_STEP), 1.0).astype(np.int64)
    return fx0, fy0, fx1, fy1, steps


def sample_count(segments: pa.Table, zoom: int) -> int:
    """Samples the segments make at ``zoom`` (each segment: its intervals + 1)."""
    if not segments.num_rows:
        return 0
    return int((_steps(segments, zoom)[4] + 1).sum())


def estimated_bytes(segments: pa.Table, zoom: int) -> int:
    return sample_count(segments, zoom) * SAMPLE_BYTES


def _samples(segments: pa.Table, zoom: int) -> tuple[Floats, Floats]:
    fx0, fy0, fx1, fy1, steps = _steps(segments, zoom)
    per_segment = steps + 1
    owner = np.repeat(np.arange(len(steps)), per_segment)
    first = np.cumsum(per_segment) - per_segment
    i = np.arange(int(per_segment.sum()), dtype=np.int64) - first[owner]
    t = i.astype(np.float64) / steps[owner].astype(np.float64)
    return fx0[owner] + (fx1[owner] - fx0[owner]) * t, fy0[owner] + (fy1[owner] - fy0[owner]) * t


def _tile_range(frac: Floats, zoom: int) -> tuple[Ints, Ints]:
    """tile_columns.buffered_tile_range."""
    last = (1 << zoom) - 1
    low = np.maximum(np.floor(frac - TILE_BUFFER), 0.0).astype(np.int64)
    high = np.minimum(np.floor(frac + TILE_BUFFER), float(last)).astype(np.int64)
    return np.minimum(low, last), np.maximum(high, 0)


def _base_tiles(segments: pa.Table, zoom: int) -> Ints:
    """Distinct buffered tiles of every sample at ``zoom``, as keys ``x << zoom | y``."""
    fx, fy = _samples(segments, zoom)
    x0, x1 = _tile_range(fx, zoom)
    y0, y1 = _tile_range(fy, zoom)
    keys = [((x0 + dx) << zoom) | (y0 + dy) for dx in (0, 1) for dy in (0, 1)]
    wanted = [(x0 + dx <= x1) & (y0 + dy <= y1) for dx in (0, 1) for dy in (0, 1)]
    return np.unique(np.concatenate([k[w] for k, w in zip(keys, wanted, strict=True)]))


def expire_on_driver(segments: pa.Table, min_zoom: int, max_zoom: int) -> Collected:
    """The metatiles (z, mx, my, expired tiles in it) of ``segments`` at every zoom min..max, sorted by
    (z, mx, my): what ``collect([metatile_rows(expired_metatiles(...))])`` gives for the same segments."""
    parts: list[tuple[Ints, Ints, Ints, Ints]] = []
    if segments.num_rows:
        keys = _base_tiles(segments, max_zoom)
        x, y = keys >> max_zoom, keys & ((1 << max_zoom) - 1)
        for z in range(min_zoom, max_zoom + 1):
            shift = max_zoom - z
            tiles = np.unique(((x >> shift) << z) | (y >> shift))
            tx, ty = tiles >> z, tiles & ((1 << z) - 1)
            # Metatiles as keys mx << z | my: sorted by (mx, my), as the publishing order wants.
            metas, counts = np.unique(((tx >> METATILE_SHIFT) << z) | (ty >> METATILE_SHIFT), return_counts=True)
            parts.append((np.full(len(metas), z, np.int64), metas >> z, metas & ((1 << z) - 1), counts))
    columns = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(4)]
    table = pa.table(
        {
            "z": pa.array(columns[0], pa.int32()),
            "mx": pa.array(columns[1], pa.int64()),
            "my": pa.array(columns[2], pa.int64()),
            "n": pa.array(columns[3], pa.int64()),
        }
    )
    return Collected(metatiles=table)
