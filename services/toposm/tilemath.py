"""Tile and metatile arithmetic for the TopOSM services.

A tile is ``z/x/y`` in the usual slippy-map scheme (0 <= x, y < 2**z). A metatile is the 8x8 block of
tiles that one render produces, addressed ``z/mx/my`` with ``mx = x >> 3``; at zooms 0-2 a zoom has fewer
than 8x8 tiles, so one metatile (``z/0/0``) holds the whole zoom.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .contract import EXPIRY_SEPARATOR, METATILE_SHIFT, METATILE_SIZE

MAX_SUPPORTED_ZOOM = 30


class TileError(ValueError):
    """A tile or metatile string that is malformed or outside the allowed range."""


@dataclass(frozen=True, order=True, slots=True)
class Tile:
    z: int
    x: int
    y: int

    def __str__(self) -> str:
        return f"{self.z}/{self.x}/{self.y}"

    @property
    def metatile(self) -> Metatile:
        return Metatile(self.z, self.x >> METATILE_SHIFT, self.y >> METATILE_SHIFT)


@dataclass(frozen=True, order=True, slots=True)
class Metatile:
    z: int
    mx: int
    my: int

    def __str__(self) -> str:
        return f"{self.z}/{self.mx}/{self.my}"

    @property
    def side(self) -> int:
        """Tiles per side: 8, or the whole zoom below zoom 3."""
        return min(METATILE_SIZE, 1 << self.z)

    @property
    def top_left(self) -> Tile:
        return Tile(self.z, self.mx << METATILE_SHIFT, self.my << METATILE_SHIFT)

    def tiles(self) -> Iterator[Tile]:
        """The tiles this metatile renders, row by row."""
        x0, y0 = self.mx << METATILE_SHIFT, self.my << METATILE_SHIFT
        for dy in range(self.side):
            for dx in range(self.side):
                yield Tile(self.z, x0 + dx, y0 + dy)

    def ancestor(self, zoom: int) -> Metatile:
        """The metatile at a lower (or equal) zoom that covers this one.

        A metatile at z is aligned to 8 tiles, so its area at z-1 is a 4x4 block aligned to 4 and lies
        inside exactly one metatile there: shifting the metatile address is enough.
        """
        if zoom > self.z or zoom < 0:
            raise TileError(f"ancestor zoom {zoom} must be between 0 and {self.z}")
        shift = self.z - zoom
        return Metatile(zoom, self.mx >> shift, self.my >> shift)

    def ancestors(self, min_zoom: int) -> list[Metatile]:
        """Ancestors from zoom ``z-1`` down to ``min_zoom`` (nearest first)."""
        return [self.ancestor(z) for z in range(self.z - 1, max(min_zoom, 0) - 1, -1)]


@dataclass(frozen=True, slots=True)
class ZoomRange:
    """The zooms a queuemaster accepts, inclusive."""

    min_zoom: int = 0
    max_zoom: int = 18

    def __post_init__(self) -> None:
        if not 0 <= self.min_zoom <= self.max_zoom <= MAX_SUPPORTED_ZOOM:
            raise ValueError(f"bad zoom range {self.min_zoom}-{self.max_zoom}")

    def __contains__(self, zoom: object) -> bool:
        return isinstance(zoom, int) and self.min_zoom <= zoom <= self.max_zoom


def _parse_triple(text: str, what: str) -> tuple[int, int, int]:
    parts = text.strip().split("/")
    if len(parts) != 3:
        raise TileError(f"{what} {text!r} is not of the form z/x/y")
    try:
        # int() accepts "+3", " 3" and "٣"; a tile address is plain ASCII digits only.
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError
        z, x, y = (int(p) for p in parts)
    except ValueError:
        raise TileError(f"{what} {text!r} has a non-numeric or negative part") from None
    return z, x, y


def _check_zoom(z: int, text: str, zooms: ZoomRange | None) -> None:
    if z > MAX_SUPPORTED_ZOOM:
        raise TileError(f"{text!r}: zoom {z} is above {MAX_SUPPORTED_ZOOM}")
    if zooms is not None and z not in zooms:
        limits = f"{zooms.min_zoom}-{zooms.max_zoom}"
        raise TileError(f"{text!r}: zoom {z} is outside the configured range {limits}")


def parse_tile(text: str, zooms: ZoomRange | None = None) -> Tile:
    """Parse ``z/x/y``; raise TileError naming the problem if malformed or out of range."""
    z, x, y = _parse_triple(text, "tile")
    _check_zoom(z, text, zooms)
    limit = 1 << z
    if x >= limit or y >= limit:
        raise TileError(f"tile {text!r}: x and y must be below 2^{z} = {limit}")
    return Tile(z, x, y)


def parse_metatile(text: str, zooms: ZoomRange | None = None) -> Metatile:
    """Parse ``z/mx/my`` (a metatile address); raise TileError if malformed or out of range."""
    z, mx, my = _parse_triple(text, "metatile")
    _check_zoom(z, text, zooms)
    limit = max(1, (1 << z) >> METATILE_SHIFT)
    if mx >= limit or my >= limit:
        raise TileError(f"metatile {text!r}: mx and my must be below {limit} at zoom {z}")
    return Metatile(z, mx, my)


_TRIPLE = re.compile(r"([0-9]+)/([0-9]+)/([0-9]+)")


def parse_tile_list(text: str, zooms: ZoomRange | None = None) -> tuple[list[Tile], list[str]]:
    """Parse an expiry list; returns the valid tiles and one problem message per invalid item.

    The hot path of expiry ingestion (hundreds of thousands of tiles a second): one regex match and the
    range checks inline per item; any item it does not accept goes through ``parse_tile`` for its message.
    """
    tiles: list[Tile] = []
    problems: list[str] = []
    low, high = (zooms.min_zoom, zooms.max_zoom) if zooms is not None else (0, MAX_SUPPORTED_ZOOM)
    high = min(high, MAX_SUPPORTED_ZOOM)
    match = _TRIPLE.fullmatch
    append = tiles.append
    for part in text.replace("\n", EXPIRY_SEPARATOR).split(EXPIRY_SEPARATOR):  # split_expiry_list, inlined
        item = part.strip()
        if not item:
            continue
        found = match(item)
        # A digit string longer than int() takes (4300 digits) is left to parse_tile, which words it.
        if found is not None and len(item) < 100:
            z, x, y = int(found[1]), int(found[2]), int(found[3])
            if low <= z <= high and x < (1 << z) and y < (1 << z):
                append(Tile(z, x, y))
                continue
        try:
            append(parse_tile(item, zooms))
        except TileError as exc:
            problems.append(str(exc))
    return tiles, problems


def unique_metatiles(tiles: Iterable[Tile]) -> list[Metatile]:
    """Metatiles of the given tiles, each once, in first-seen order."""
    return list(dict.fromkeys(t.metatile for t in tiles))


def metatiles_per_zoom(zoom: int) -> int:
    """How many metatiles a zoom has (the ``by_zoom`` strategy's weight)."""
    side = max(1, (1 << zoom) >> METATILE_SHIFT)
    return side * side
