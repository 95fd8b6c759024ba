"""The import's line features (roads, railways, waterways, coastline) for a block of ways at once.

The same features as ``FeatureExtractor.way`` (which diff updates use, one way at a time): the tags decide
the features (``tags.line_features``, once per distinct tag text), and the geometry is the way's node
locations in Web Mercator, nodes missing from the extract left out and a node repeating the previous one
dropped. Here the locations of all the block's refs are looked up in the on-disk index and projected as
numpy arrays, so Python's work is per feature, not per node.
"""

from __future__ import annotations

import struct

import numpy as np

from . import tags as osm_tags
from .node_locations import NodeLocations
from .opl_columns import Ways, distinct_tags, opl_tags
from .render_cluster import BulkFeatureWriter
from .render_db import attribute_values
from .wkb import mercator_arrays

_LINESTRING = 2


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of range(starts[i], starts[i] + lengths[i])."""
    total = int(lengths.sum())
    first = np.cumsum(lengths) - lengths
    return np.arange(total) - np.repeat(first, lengths) + np.repeat(starts, lengths)


def _features(raw_tags: str) -> list[tuple[str, tuple[object, ...]]]:
    return [(table, attribute_values(table, attrs)) for table, attrs in osm_tags.line_features(opl_tags(raw_tags))]


def write_line_features(ways: Ways, locations: NodeLocations, writer: BulkFeatureWriter) -> int:
    """Add the line features of ``ways``; returns how many ways made one."""
    features = distinct_tags(ways.tags, _features)
    chosen = np.array([i for i, f in enumerate(features) if f], dtype=np.int64)
    if len(chosen) == 0:
        return 0
    lengths = np.diff(ways.offsets)[chosen]
    refs = ways.refs[_ranges(ways.offsets[chosen], lengths)]
    way_of_ref = np.repeat(np.arange(len(chosen)), lengths)
    located = locations.locate(refs)
    keep = located.valid
    x, y = mercator_arrays(located.lon[keep], located.lat[keep])
    way_of_ref = way_of_ref[keep]
    repeat = np.zeros(len(x), dtype=bool)
    repeat[1:] = (x[1:] == x[:-1]) & (y[1:] == y[:-1]) & (way_of_ref[1:] == way_of_ref[:-1])
    x, y, way_of_ref = x[~repeat], y[~repeat], way_of_ref[~repeat]
    counts = np.bincount(way_of_ref, minlength=len(chosen))
    ends = np.cumsum(counts)
    starts = ends - counts
    drawn = np.flatnonzero(counts >= 2)
    if len(drawn) == 0:
        return 0
    coords = np.empty((len(x), 2))
    coords[:, 0], coords[:, 1] = x, y
    data = coords.tobytes()
    # Bounding boxes per way with any coordinate (segments of x and y between consecutive starts), then the
    # drawn ones among them.
    present = np.flatnonzero(counts > 0)
    boxes = [
        np.minimum.reduceat(x, starts[present]),
        np.minimum.reduceat(y, starts[present]),
        np.maximum.reduceat(x, starts[present]),
        np.maximum.reduceat(y, starts[present]),
    ]
    pick = np.searchsorted(present, drawn)
    minx, miny, maxx, maxy = (b[pick].tolist() for b in boxes)
    for j, start, count, x0, y0, x1, y1 in zip(
        drawn.tolist(), starts[drawn].tolist(), counts[drawn].tolist(), minx, miny, maxx, maxy, strict=True
    ):
        i = int(chosen[j])
        geom = struct.pack("<BII", 1, _LINESTRING, count) + data[start * 16 : (start + count) * 16]
        way_id = int(ways.ids[i])
        for table, values in features[i]:
            writer.add_values(table, "w", way_id, values, geom, (x0, y0, x1, y1))
    return len(drawn)
