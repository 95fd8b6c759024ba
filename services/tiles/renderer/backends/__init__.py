"""Render backends: turn a metatile into PNG bytes per tile.

``testpattern`` (Pillow, fast, for tests and benchmarks) and ``mapnik`` (real map from the shipped style
and dataset). Backends are created inside render worker processes and cached there.
"""

from __future__ import annotations

from typing import Protocol

from services.toposm.tilemath import Metatile, Tile

TILE_SIZE = 256
BACKEND_NAMES = ("testpattern", "mapnik")


class Backend(Protocol):
    def render(self, metatile: Metatile) -> dict[Tile, bytes]: ...


def create_backend(name: str) -> Backend:
    if name == "testpattern":
        from .testpattern import TestPatternBackend

        return TestPatternBackend()
    if name == "mapnik":
        from .mapnik_backend import MapnikBackend

        return MapnikBackend()
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
