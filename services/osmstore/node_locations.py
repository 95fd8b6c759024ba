"""Node locations on disk: libosmium's ``sparse_file_array`` index, filled by its C++ pass, read with numpy.

The import keeps every node location in one file instead of memory (osm2pgsql's flat-nodes idea): libosmium's
``NodeLocationsForWays`` handler writes it while it reads the extract, and libosmium's area assembler reads it
back. The file is an array of (id: uint64, x: int32, y: int32) records, x and y in units of 1e-7 degree (the
OSM precision), sorted by id by the handler once the first way arrives, followed by unused capacity. The
import then reads it as a memory-mapped numpy array, so node locations are looked up for millions of way
refs at a time (a binary search per ref, in C) and loaded into the stores in bulk, and memory holds only the
pages in use (the kernel's page cache, not the process's heap).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import osmium

RECORD = np.dtype([("id", "<u8"), ("x", "<i4"), ("y", "<i4")])
UNDEFINED = 2**31 - 1  # libosmium's undefined coordinate (a node without a valid location)
SCALE = 10_000_000  # coordinate units per degree


def create_index(path: Path) -> osmium.index.LocationTable:
    """A new file-backed location index at ``path`` (libosmium's sparse_file_array)."""
    return osmium.index.create_map(f"sparse_file_array,{path}")


@dataclass
class LocatedRefs:
    lon: np.ndarray  # float64 degrees, NaN where the node is unknown or has no valid location
    lat: np.ndarray

    @property
    def valid(self) -> np.ndarray:
        return ~np.isnan(self.lon)


class NodeLocations:
    """The index file written by libosmium, read-only: ``count`` nodes with (id, x, y)."""

    def __init__(self, path: Path, count: int) -> None:
        self.path = path
        self.count = count
        if count == 0:
            self.records = np.zeros(0, RECORD)
            return
        self.records = np.memmap(path, dtype=RECORD, mode="r", shape=(count,))
        ids = self.records["id"]
        if count > 1 and not bool(np.all(ids[1:] >= ids[:-1])):  # no way after the nodes: never sorted
            self.records = np.sort(np.asarray(self.records), order="id", kind="stable")

    @classmethod
    def of_index(cls, path: Path, index: osmium.index.LocationTable) -> NodeLocations:
        # used_memory is the record count times the record size for libosmium's vector-based maps
        return cls(path, index.used_memory() // RECORD.itemsize)

    def batches(self, size: int = 100_000) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(ids, lon, lat) of the nodes with a valid location, in id order, ``size`` records at a time."""
        for start in range(0, self.count, size):
            chunk = np.asarray(self.records[start : start + size])
            keep = chunk["x"] != UNDEFINED
            chunk = chunk[keep] if not keep.all() else chunk
            yield (chunk["id"].astype(np.int64), chunk["x"] / SCALE, chunk["y"] / SCALE)

    def locate(self, refs: np.ndarray) -> LocatedRefs:
        """The locations of node ``refs`` (int64), NaN for a node not in the index or without a location."""
        lon = np.full(len(refs), np.nan)
        lat = np.full(len(refs), np.nan)
        if self.count == 0 or len(refs) == 0:
            return LocatedRefs(lon, lat)
        ids = self.records["id"]
        wanted = refs.astype(np.uint64)
        pos = np.searchsorted(ids, wanted)
        inside = pos < self.count
        pos[~inside] = 0
        found = inside & (ids[pos] == wanted) & (refs > 0)
        hit = self.records[pos[found]]
        good = hit["x"] != UNDEFINED
        where = np.flatnonzero(found)[good]
        lon[where] = hit["x"][good] / SCALE
        lat[where] = hit["y"][good] / SCALE
        return LocatedRefs(lon, lat)

    def bounds(self) -> list[float] | None:
        """(west, south, east, north) of the valid locations, or None when there are none."""
        west, south, east, north = UNDEFINED, UNDEFINED, -UNDEFINED, -UNDEFINED
        for start in range(0, self.count, 4_000_000):
            chunk = np.asarray(self.records[start : start + 4_000_000])
            chunk = chunk[chunk["x"] != UNDEFINED]
            if len(chunk):
                west, east = min(west, int(chunk["x"].min())), max(east, int(chunk["x"].max()))
                south, north = min(south, int(chunk["y"].min())), max(north, int(chunk["y"].max()))
        if west == UNDEFINED:
            return None
        return [west / SCALE, south / SCALE, east / SCALE, north / SCALE]
