"""Expiry lists straight to packed metatile keys: the ingestion hot path, without a Python object per tile.

An expiry message (``z/x/y;z/x/y;...``, hundreds of thousands of tiles a second) needs only the metatile
of each tile, and the queue keys metatiles by ``z << 56 | mx << 28 | my`` (``contract.metatile_key``, written
out inline from the contract's shifts: no call per tile on this path). A well-formed list (digits,
slashes, separators; nothing else) is checked by one regex over the whole text, its numbers taken by one
``findall``, and the keys computed from plain ints; no ``Tile`` or ``Metatile`` is built. Anything else
(a malformed item, a tile outside the zoom range or its zoom, odd whitespace, a number too long for
``int``) goes through ``parse_tile_list``, item by item, so the results and the problem messages are
exactly the ones of the general parser.
"""

from __future__ import annotations

import re

from services.toposm.contract import KEY_COORD_BITS, KEY_COORD_MASK, KEY_ZOOM_SHIFT, METATILE_SHIFT
from services.toposm.tilemath import MAX_SUPPORTED_ZOOM, ZoomRange, parse_tile_list

# Items are z/x/y of ASCII digits; separators ';' or newline, with blanks and empty items around them.
_WELL_FORMED = re.compile(
    r"[ \t\r\n;]*[0-9]+/[0-9]+/[0-9]+"
    r"(?:[ \t\r]*[;\n][ \t\r\n;]*[0-9]+/[0-9]+/[0-9]+)*[ \t\r\n;]*"
)
_NUMBER = re.compile(r"[0-9]+")


def expiry_keys(text: str, zooms: ZoomRange | None = None) -> tuple[list[int], list[str]]:
    """The packed metatile key of every valid tile of an expiry list, in list order (duplicates kept), and
    one problem message per invalid item: ``parse_tile_list``'s result, as keys."""
    low, high = (zooms.min_zoom, zooms.max_zoom) if zooms is not None else (0, MAX_SUPPORTED_ZOOM)
    high = min(high, MAX_SUPPORTED_ZOOM)
    if _WELL_FORMED.fullmatch(text):
        try:
            numbers = list(map(int, _NUMBER.findall(text)))
        except ValueError:  # a number longer than int() takes: the general parser words the problem
            numbers = []
        triples = list(zip(numbers[0::3], numbers[1::3], numbers[2::3], strict=True))
        zs = numbers[0::3]
        # (x | y) >> z == 0 is x, y < 2**z; a shift by a huge z never happens, the zoom is checked first.
        if zs and low <= min(zs) and max(zs) <= high and all(not (x | y) >> z for z, x, y in triples):
            return [
                (z << KEY_ZOOM_SHIFT) | ((x >> METATILE_SHIFT) << KEY_COORD_BITS) | (y >> METATILE_SHIFT)
                for z, x, y in triples
            ], []
    tiles, problems = parse_tile_list(text, zooms)
    return [
        (t.z << KEY_ZOOM_SHIFT) | ((t.x >> METATILE_SHIFT) << KEY_COORD_BITS) | (t.y >> METATILE_SHIFT) for t in tiles
    ], problems


def ancestor_keys(keys: dict[int, None], min_zoom: int) -> None:
    """Add to ``keys`` (an insertion-ordered set) the ancestor metatiles of each, down to ``min_zoom``:
    ``z'/(mx >> (z - z'))/(my >> (z - z'))``, nearest first, as ``Metatile.ancestors`` gives them."""
    for key in list(keys):
        z, mx, my = key >> KEY_ZOOM_SHIFT, (key >> KEY_COORD_BITS) & KEY_COORD_MASK, key & KEY_COORD_MASK
        for zoom in range(z - 1, max(min_zoom, 0) - 1, -1):
            shift = z - zoom
            ancestor = (zoom << KEY_ZOOM_SHIFT) | ((mx >> shift) << KEY_COORD_BITS) | (my >> shift)
            if ancestor in keys:
                break  # its ancestors were added already
            keys[ancestor] = None
