"""What runs inside a render worker process: render one metatile and write its tiles.

Rendering is CPU-bound, so the renderer's event loop hands it to a process pool; the backend (a loaded
Mapnik map is expensive) is created once per worker process and reused.
"""

from __future__ import annotations

import time

from services.toposm.tile_store import open_tile_store
from services.toposm.tilemath import parse_metatile

from .backends import Backend, create_backend

_backends: dict[str, Backend] = {}


def _backend(name: str) -> Backend:
    backend = _backends.get(name)
    if backend is None:
        backend = _backends[name] = create_backend(name)
    return backend


def warm_up(backend_name: str) -> int:
    """Load the backend in this worker before the first render (keeps first-render latency low)."""
    import os

    _backend(backend_name)
    return os.getpid()


def render_metatile(
    backend_name: str, tile_root: str, metatile_text: str, extra_delay: float = 0.0, tile_store: str = "png"
) -> float:
    """Render and store one metatile (``tile_store``: png or meta); returns the render duration in seconds.
    Raises on failure.

    ``extra_delay`` stretches a render to simulate slow, real-world rendering (tests and demos use it to
    catch a renderer mid-render); it is 0 in production.
    """
    started = time.perf_counter()
    metatile = parse_metatile(metatile_text)
    tiles = _backend(backend_name).render(metatile)
    if extra_delay > 0:
        time.sleep(extra_delay)
    open_tile_store(tile_root, tile_store).write(tiles)
    return time.perf_counter() - started
