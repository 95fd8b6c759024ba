"""mod_tile's ``.meta`` file: the 64 tiles of one metatile in one file, as renderd writes them.

The layout (mod_tile ``includes/metatile.h``, ``src/metatile.cpp``, ``src/store_file.c``), little-endian
32-bit integers as on every platform renderd runs on:

* a header: the magic ``META``, ``count`` (64, for 8x8), then ``x``, ``y`` (the metatile's top-left tile) and
  ``z``;
* ``count`` index entries (offset from the start of the file, size), entry ``(x & 7) * 8 + (y & 7)`` for tile
  ``x, y`` (columns first);
* the tiles' bytes, written in index order. A tile a metatile does not have (zooms 0-2 have fewer than 8x8)
  has size 0.

The file of the metatile holding tile ``x, y`` at zoom ``z`` is ``z/h4/h3/h2/h1/h0.meta`` (mod_tile's
``xyz_to_meta``): with ``x, y`` rounded down to the metatile, byte ``h[i]`` is the ``i``-th lowest nibble of
``x`` over the ``i``-th lowest nibble of ``y`` (``(x_i << 4) | y_i``), so 16x16 tiles share a directory.
``METZ`` (compressed) files, which renderd does not write by default, are not read.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import BinaryIO

from .contract import METATILE_SIZE
from .tilemath import Metatile, Tile

MAGIC = b"META"
HEADER = struct.Struct("<4s4i")  # magic, count, x, y, z
ENTRY = struct.Struct("<2i")  # offset, size
COUNT = METATILE_SIZE * METATILE_SIZE
HEADER_SIZE = HEADER.size + COUNT * ENTRY.size  # 532 bytes
MAX_TILE_BYTES = 16 * 1024 * 1024  # a tile claiming more is a damaged file, not a tile
SUFFIX = ".meta"
# The path hashes five nibbles of x and y (20 bits): from zoom 21 on, two metatiles would share a file, so
# mod_tile stops at 20 (MAX_ZOOM) and so does this store.
MAX_META_ZOOM = 20


class MetaFileError(ValueError):
    """A ``.meta`` file that is not what its header says (truncated, foreign, damaged)."""


def meta_relpath(tile: Tile | Metatile) -> PurePosixPath:
    """``z/h4/h3/h2/h1/h0.meta`` of the metatile holding ``tile`` (or of a metatile)."""
    top_left = tile.top_left if isinstance(tile, Metatile) else tile.metatile.top_left
    x, y = top_left.x, top_left.y
    hashed = []
    for _ in range(5):
        hashed.append(((x & 0x0F) << 4) | (y & 0x0F))
        x >>= 4
        y >>= 4
    return PurePosixPath(str(top_left.z), *(str(h) for h in reversed(hashed[1:]))) / f"{hashed[0]}{SUFFIX}"


def xy_of_relpath(parts: tuple[str, ...]) -> tuple[int, int] | None:
    """The top-left tile ``(x, y)`` of the metatile whose file is ``h4, h3, h2, h1, h0.meta`` (the five path
    parts below the zoom); None when they are not such a path."""
    if len(parts) != 5 or not parts[4].endswith(SUFFIX):
        return None
    names = [*parts[:4], parts[4][: -len(SUFFIX)]]
    if not all(n.isascii() and n.isdigit() and int(n) < 256 for n in names):
        return None
    x = y = 0
    for name in names:  # h4 (highest nibbles) first
        x = (x << 4) | (int(name) >> 4)
        y = (y << 4) | (int(name) & 0x0F)
    return x, y


def index_of(tile: Tile) -> int:
    return (tile.x % METATILE_SIZE) * METATILE_SIZE + tile.y % METATILE_SIZE


def encode(metatile: Metatile, tiles: Mapping[Tile, bytes]) -> bytes:
    """The ``.meta`` file of a metatile's tiles (any tile missing from ``tiles`` is stored empty)."""
    top_left = metatile.top_left
    entries, blobs = [], []
    offset = HEADER_SIZE
    for dx in range(METATILE_SIZE):  # index order: columns first
        for dy in range(METATILE_SIZE):
            data = tiles.get(Tile(metatile.z, top_left.x + dx, top_left.y + dy), b"")
            entries.append(ENTRY.pack(offset, len(data)))
            blobs.append(data)
            offset += len(data)
    return b"".join([HEADER.pack(MAGIC, COUNT, top_left.x, top_left.y, metatile.z), *entries, *blobs])


def read_tile(f: BinaryIO, tile: Tile) -> bytes:
    """One tile's bytes from an open ``.meta`` file: the header and the tile's entry, then a seek. Raises
    MetaFileError when the file is damaged or is another metatile's; an empty tile reads as ``b""``."""
    head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        raise MetaFileError(f"{len(head)} bytes: shorter than the {HEADER_SIZE}-byte header")
    magic, count, x, y, z = HEADER.unpack_from(head)
    if magic != MAGIC or count != COUNT:
        raise MetaFileError(f"header {magic!r} with {count} tiles; expected {MAGIC!r} with {COUNT}")
    expected = tile.metatile.top_left
    if (x, y, z) != (expected.x, expected.y, expected.z):
        raise MetaFileError(f"holds metatile {z}/{x}/{y} (top-left tile), not the one of {tile}")
    offset, size = ENTRY.unpack_from(head, HEADER.size + index_of(tile) * ENTRY.size)
    if size == 0:
        return b""
    if offset < HEADER_SIZE or not 0 < size <= MAX_TILE_BYTES:
        raise MetaFileError(f"index entry of {tile} is out of range (offset {offset}, size {size})")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise MetaFileError(f"tile {tile} is cut short ({len(data)} of {size} bytes)")
    return data
