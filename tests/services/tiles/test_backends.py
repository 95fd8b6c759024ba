"""Backends draw real PNGs; the tile store writes them atomically where tile servers expect them."""

import io

import mercantile
from PIL import Image

from services.tiles.renderer.backends import create_backend
from services.tiles.renderer.worker import render_metatile
from services.toposm.tile_store import TileStore
from services.toposm.tilemath import Metatile, Tile, parse_metatile


def test_testpattern_metatile(tmp_path):
    m = parse_metatile("6/3/2")
    tiles = create_backend("testpattern").render(m)
    assert set(tiles) == set(m.tiles())
    img = Image.open(io.BytesIO(tiles[Tile(6, 25, 17)]))
    assert img.size == (256, 256)
    # border drawn at the tile's edge, background inside
    assert img.getpixel((0, 128))[0] > 150 and img.getpixel((0, 128))[1] < 50
    assert img.getpixel((128, 200)) != img.getpixel((0, 128))


def test_low_zoom_metatile_has_whole_zoom(tmp_path):
    duration = render_metatile("testpattern", str(tmp_path), "1/0/0")
    assert duration > 0
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")) == [
        "1/0/0.png",
        "1/0/1.png",
        "1/1/0.png",
        "1/1/1.png",
    ]
    assert not list(tmp_path.rglob("*.tmp"))
    assert TileStore(tmp_path).metatile_exists(Metatile(1, 0, 0))


def test_mapnik_draws_the_town(tmp_path):
    t = mercantile.tile(-19.95, 45.04, 16)  # Port Qbroker
    m = Tile(16, t.x, t.y).metatile
    render_metatile("mapnik", str(tmp_path), str(m))
    pngs = list(tmp_path.rglob("*.png"))
    assert len(pngs) == 64
    centre = Image.open(TileStore(tmp_path).path(Tile(16, t.x, t.y))).convert("RGB")
    colours = centre.getcolors(256 * 256)
    assert len(colours) > 20  # roads, buildings, labels: not a flat fill
    # land colour of the style present, and not everything sea
    assert any(abs(r - 0xF2) < 6 and abs(g - 0xEF) < 6 and abs(b - 0xE9) < 6 for _, (r, g, b) in colours)
    sea_tile = Image.open(TileStore(tmp_path).path(Tile(16, m.mx * 8 + 7, m.my * 8 + 7))).convert("RGB")
    assert sea_tile.size == (256, 256)
