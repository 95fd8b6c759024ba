"""Web-mercator tile math as Spark SQL column expressions, plus plain-Python and numpy twins.

Everything here is a ``Column`` expression so that Catalyst compiles it to JVM code: no Python UDF
round-trips per row. The plain-Python functions at the bottom implement the same semantics for the
benchmark reference and for documentation; the tests use ``mercantile`` as the independent oracle.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from pyspark.sql import Column
from pyspark.sql import functions as F

MAX_ZOOM_LIMIT = 22
# Web mercator is only defined up to this latitude; points beyond it land on the first/last tile row.
MAX_LATITUDE = 85.0511287798066
# osm2pgsql's TILE_EXPIRY_LEEWAY: a point closer than 0.1 tile to an edge also expires the neighbour.
TILE_BUFFER = 0.1
# Ways are sampled every 0.2 tile (Chebyshev): with the 0.1 buffer every point of a segment is then
# within the buffer of a sample, so every tile the segment crosses is expired.
WAY_SAMPLE_STEP = 0.2
ZOOM_KEY_SHIFT = 58  # zoom lives in bits 58..62 of the key; bits 0..43 hold the morton code (z <= 22)

_MORTON_MASKS = (
    (16, 0x0000FFFF0000FFFF),
    (8, 0x00FF00FF00FF00FF),
    (4, 0x0F0F0F0F0F0F0F0F),
    (2, 0x3333333333333333),
    (1, 0x5555555555555555),
)


def frac_tile_x(lon: Column, zoom: int) -> Column:
    """Fractional tile column (tile units) of a longitude at ``zoom``."""
    return (lon + F.lit(180.0)) / F.lit(360.0) * F.lit(float(1 << zoom))


def frac_tile_y(lat: Column, zoom: int) -> Column:
    """Fractional tile row of a latitude at ``zoom``; latitudes are clamped to the mercator limit."""
    clamped = F.greatest(F.least(lat, F.lit(MAX_LATITUDE)), F.lit(-MAX_LATITUDE))
    sin_lat = F.sin(F.radians(clamped))
    merc = F.ln((F.lit(1.0) + sin_lat) / (F.lit(1.0) - sin_lat)) / F.lit(4.0 * math.pi)
    return (F.lit(0.5) - merc) * F.lit(float(1 << zoom))


def buffered_tile_range(frac: Column, zoom: int) -> tuple[Column, Column]:
    """First and last tile index touched by ``frac`` +- the buffer, clamped to the map (no wrap)."""
    last = (1 << zoom) - 1
    low = F.greatest(F.floor(frac - F.lit(TILE_BUFFER)), F.lit(0)).cast("long")
    high = F.least(F.floor(frac + F.lit(TILE_BUFFER)), F.lit(last)).cast("long")
    # A point exactly on the right/bottom map edge (lon=180) must still map to the last tile.
    return F.least(low, F.lit(last)).cast("long"), F.greatest(high, F.lit(0)).cast("long")


def _spread_bits(value: Column) -> Column:
    """Interleave zeros between the low 32 bits of ``value`` (the morton 'part1by1')."""
    out = value.cast("long")
    for shift, mask in _MORTON_MASKS:
        out = F.shiftleft(out, shift).bitwiseOR(out).bitwiseAND(F.lit(mask))
    return out


def tile_key(z: Column, x: Column, y: Column) -> Column:
    """64-bit key: zoom in the top bits, quadkey-ordered morton code of (x, y) below."""
    morton = F.shiftleft(_spread_bits(y), 1).bitwiseOR(_spread_bits(x))
    return F.shiftleft(z.cast("long"), ZOOM_KEY_SHIFT).bitwiseOR(morton)


# --- plain Python twins (benchmark reference, docs) -------------------------------------------


def py_frac_tile(lon: float, lat: float, zoom: int) -> tuple[float, float]:
    n = float(1 << zoom)
    lat = max(min(lat, MAX_LATITUDE), -MAX_LATITUDE)
    sin_lat = math.sin(math.radians(lat))
    merc = math.log((1.0 + sin_lat) / (1.0 - sin_lat)) / (4.0 * math.pi)
    return (lon + 180.0) / 360.0 * n, (0.5 - merc) * n


def np_frac_tile(
    lon: npt.NDArray[np.float64], lat: npt.NDArray[np.float64], zoom: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``py_frac_tile`` over arrays (numpy): the same expressions in the same order. The transcendental
    functions are numpy's, as the JVM's are Spark's; they may differ from each other in the last bit,
    which moves a tile only for a point within ~1e-16 tile of a buffer edge."""
    n = float(1 << zoom)
    sin_lat = np.sin(np.radians(np.maximum(np.minimum(lat, MAX_LATITUDE), -MAX_LATITUDE)))
    merc = np.log((1.0 + sin_lat) / (1.0 - sin_lat)) / (4.0 * math.pi)
    return (lon + 180.0) / 360.0 * n, (0.5 - merc) * n


def shift_right(value: Column | str, bits: Column) -> Column:
    """``value >> bits`` with a per-row shift (F.shiftright only takes a constant)."""
    return F.call_function("shiftright", F.col(value) if isinstance(value, str) else value, bits)


def shift_left(value: Column | str, bits: Column) -> Column:
    return F.call_function("shiftleft", F.col(value) if isinstance(value, str) else value, bits)
