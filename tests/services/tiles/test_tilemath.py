"""Tile and metatile arithmetic, checked against mercantile where it overlaps."""

import mercantile
import pytest

from services.toposm.tilemath import (
    Metatile,
    Tile,
    TileError,
    ZoomRange,
    metatiles_per_zoom,
    parse_metatile,
    parse_tile,
    parse_tile_list,
    unique_metatiles,
)


def test_parse_tile_roundtrip_and_metatile():
    t = parse_tile("15/7601/9882")
    assert t == Tile(15, 7601, 9882)
    assert str(t.metatile) == "15/950/1235"  # the seed's own example metatile
    assert t.metatile.side == 8


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1/2",
        "1/2/3/4",
        "a/1/1",
        "1/-1/0",
        "1/+1/0",
        "3/8/0",
        "3/0/8",
        "0/1/0",
        "31/0/0",
        "1/ 1/0",
        "1/1.0/0",
        "١/0/0",
    ],
)
def test_parse_tile_rejects(text):
    with pytest.raises(TileError):
        parse_tile(text)


def test_zoom_range_enforced():
    zooms = ZoomRange(2, 10)
    assert parse_tile("10/1023/0", zooms).z == 10
    with pytest.raises(TileError, match="outside the configured range 2-10"):
        parse_tile("11/0/0", zooms)
    with pytest.raises(TileError, match="outside"):
        parse_tile("1/0/0", zooms)
    with pytest.raises(ValueError):
        ZoomRange(5, 4)


@pytest.mark.parametrize("z", [0, 1, 2])
def test_low_zoom_one_metatile_holds_the_zoom(z):
    m = Metatile(z, 0, 0)
    tiles = list(m.tiles())
    assert len(tiles) == 4**z
    assert {t.metatile for t in tiles} == {m}
    assert parse_metatile(f"{z}/0/0") == m
    with pytest.raises(TileError):
        parse_metatile(f"{z}/1/0")


def test_metatile_tiles_are_its_8x8_block():
    m = parse_metatile("5/3/1")
    tiles = list(m.tiles())
    assert len(tiles) == 64
    assert {t.metatile for t in tiles} == {m}
    assert min(tiles) == Tile(5, 24, 8) and max(tiles) == Tile(5, 31, 15)
    with pytest.raises(TileError):
        parse_metatile("5/4/0")  # 2^5 / 8 = 4 metatiles per side


def test_ancestors_cover_the_metatile():
    m = Tile(16, 33000, 22000).metatile
    for ancestor in m.ancestors(0):
        # every tile of the metatile has its mercantile parent at that zoom inside the ancestor
        for t in (m.top_left, list(m.tiles())[-1]):
            parent = mercantile.parent(mercantile.Tile(t.x, t.y, t.z), zoom=ancestor.z)
            assert Tile(parent.z, parent.x, parent.y).metatile == ancestor
    assert [a.z for a in m.ancestors(12)] == [15, 14, 13, 12]
    assert m.ancestor(1) == Metatile(1, 0, 0)


def test_tile_list_parsing_and_dedup():
    tiles, problems = parse_tile_list("14/5672/3452;14/5673/3452; 14/5672/3453;;bad;3/9/9\n2/0/0")
    assert [str(t) for t in tiles] == ["14/5672/3452", "14/5673/3452", "14/5672/3453", "2/0/0"]
    assert len(problems) == 2 and "bad" in problems[0] and "3/9/9" in problems[1]
    assert [str(m) for m in unique_metatiles(tiles)] == ["14/709/431", "2/0/0"]


def test_metatiles_per_zoom():
    assert [metatiles_per_zoom(z) for z in (0, 2, 3, 4, 10)] == [1, 1, 1, 4, 128 * 128]
