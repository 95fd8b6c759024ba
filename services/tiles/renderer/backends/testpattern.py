"""Test-pattern backend, like Tirex's test backend: each tile shows its border and ``z/x/y``.

The metatile is drawn as one image (as a real renderer would) and then sliced, so slicing bugs show up
as misplaced labels.
"""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from services.toposm.tilemath import Metatile, Tile

from . import TILE_SIZE

# One background colour per zoom so neighbouring zooms are easy to tell apart in a viewer.
_ZOOM_COLOURS = [(230, 240, 255), (255, 240, 225), (230, 255, 230), (255, 250, 205), (245, 230, 255)]


class TestPatternBackend:
    __test__ = False  # not a pytest class

    def render(self, metatile: Metatile) -> dict[Tile, bytes]:
        side = metatile.side
        image = Image.new("RGB", (side * TILE_SIZE, side * TILE_SIZE), _ZOOM_COLOURS[metatile.z % 5])
        draw = ImageDraw.Draw(image)
        tiles = list(metatile.tiles())
        x0, y0 = metatile.top_left.x, metatile.top_left.y
        for tile in tiles:
            left, top = (tile.x - x0) * TILE_SIZE, (tile.y - y0) * TILE_SIZE
            box = [left, top, left + TILE_SIZE - 1, top + TILE_SIZE - 1]
            draw.rectangle(box, outline=(200, 0, 0), width=2)
            draw.text((left + 10, top + 10), str(tile), fill=(0, 0, 0))
            draw.text((left + 10, top + 26), f"meta {metatile}", fill=(90, 90, 90))
        out: dict[Tile, bytes] = {}
        for tile in tiles:
            left, top = (tile.x - x0) * TILE_SIZE, (tile.y - y0) * TILE_SIZE
            buf = io.BytesIO()
            image.crop((left, top, left + TILE_SIZE, top + TILE_SIZE)).save(buf, "PNG", compress_level=1)
            out[tile] = buf.getvalue()
        return out
