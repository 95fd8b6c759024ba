"""A render queue shaped for pick tests and the pick benchmark."""

from services.tiles.queuemaster.render_queue import RenderQueue
from services.toposm.tilemath import Metatile


def fill_half_raised(q: RenderQueue, n: int) -> list[Metatile]:
    """Queue n z14 metatiles in background, then raise every other one to important: the raised ones
    leave stale entries in the background heap that picks must skip."""
    metatiles = [Metatile(14, i % 2048, i // 2048) for i in range(n)]
    with q.batch():
        for m in metatiles:
            q.add(m, "background")
    with q.batch():
        for m in metatiles[::2]:
            q.add(m, "important")
    return metatiles
