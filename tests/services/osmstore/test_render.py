"""Render the imported Helsinki store with the TopOSM style (Mapnik backend) and look at the pixels."""

from __future__ import annotations

import io
import os
from pathlib import Path

import mercantile
import pytest
from PIL import Image

from harness.osm import Extract, osc, read_extract, way_xml, write_osc
from services.osmstore.store_diff import apply_to_store
from services.osmstore.style import LAND, ROAD_COLOURS, WATER
from services.tiles.renderer.backends.mapnik_backend import MapnikBackend
from services.tiles.renderer.main import parse_args
from services.toposm.tilemath import Tile


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


def _middle_of(extract: Extract, **want: str) -> tuple[float, float]:
    """Location of the middle node of the longest way with these tags (read with pyosmium), as far as the
    extract holds its nodes."""
    ways = [
        [r for r in refs if r in extract.nodes]
        for refs, tags in extract.ways.values()
        if all(tags.get(k) == v for k, v in want.items())
        and (refs[0] != refs[-1] or all(r in extract.nodes for r in refs))
    ]  # areas: whole ones only
    assert ways, want
    refs = max(ways, key=len)
    if refs[0] == refs[-1]:  # an area: its vertices' mean lies inside for the compact ponds used here
        lons, lats = zip(*(extract.nodes[r] for r in refs[:-1]), strict=True)
        return sum(lons) / len(lons), sum(lats) / len(lats)
    return extract.nodes[refs[len(refs) // 2]]


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _render(store: Path, lon: float, lat: float, zoom: int) -> Image.Image:
    t = mercantile.tile(lon, lat, zoom)
    tile = Tile(zoom, t.x, t.y)
    tiles = MapnikBackend(store=store).render(tile.metatile)
    return Image.open(io.BytesIO(tiles[tile])).convert("RGB")


def _share_near(image: Image.Image, colour: str, tolerance: int = 10) -> float:
    target = _rgb(colour)
    pixels = list(image.get_flattened_data())
    near = sum(1 for p in pixels if max(abs(a - b) for a, b in zip(p, target, strict=True)) <= tolerance)
    return near / len(pixels)


@pytest.mark.parametrize("zoom", [13, 14, 15, 16, 17])
def test_tiles_over_helsinki_are_a_map(imported_store: Path, extract: Extract, zoom: int) -> None:
    image = _render(imported_store, *_middle_of(extract, name="Mannerheimintie", highway="primary"), zoom)
    assert len(set(image.get_flattened_data())) > 20  # not blank, not a flat fill
    assert _share_near(image, ROAD_COLOURS["primary"][0]) > 0.002  # Mannerheimintie's fill
    assert _share_near(image, LAND) < 0.9


def test_water_is_blue(imported_store: Path, extract: Extract) -> None:
    image = _render(imported_store, *_middle_of(extract, natural="water"), 17)
    assert _share_near(image, WATER) > 0.01


def test_renamed_street_renders_its_new_name(store: Path, extract: Extract, tmp_path: Path) -> None:
    where = _middle_of(extract, name="Mikonkatu", highway="unclassified")
    before = _render(store, *where, 17)
    for wid, (refs, tags) in extract.ways.items():
        if tags.get("name") == "Mikonkatu" and tags.get("highway"):
            write_osc(tmp_path / f"{wid}.osc", osc(modify=[way_xml(wid, refs, {**tags, "name": "Qbrokerinkatu"})]))
    for diff in tmp_path.glob("*.osc"):
        apply_to_store(store, diff)
    after = _render(store, *where, 17)
    changed = sum(1 for a, b in zip(before.get_flattened_data(), after.get_flattened_data(), strict=True) if a != b)
    assert changed > 50  # the label, and only a label: the roads themselves stay
    assert _share_near(after, ROAD_COLOURS["minor"][1], 20) == pytest.approx(
        _share_near(before, ROAD_COLOURS["minor"][1], 20), abs=0.02
    )


def test_renderer_store_option(imported_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # parse_args sets TOPOSM_STORE for the worker processes: setenv first so monkeypatch restores its absence
    monkeypatch.setenv("TOPOSM_STORE", "")
    monkeypatch.delenv("TOPOSM_STORE")
    settings = parse_args(["--store", str(imported_store)])
    assert settings.backend == "mapnik" and os.environ["TOPOSM_STORE"] == str(imported_store)
    with pytest.raises(SystemExit):
        parse_args(["--store", str(tmp_path)])  # no render.sqlite there
    with pytest.raises(SystemExit):
        parse_args(["--store", str(imported_store), "--backend", "testpattern"])


def test_sea_closed_from_the_coastline(imported_store: Path, extract: Extract) -> None:
    """The bay north of Kaisaniemi is mapped only as coastline ways: it must still render as water."""
    image = _render(imported_store, *_middle_of(extract, natural="coastline"), 16)
    assert _share_near(image, WATER) > 0.05


def test_preview_picture(imported_store: Path, tmp_path: Path) -> None:
    from services.osmstore.preview import main as preview

    out = tmp_path / "p.png"
    preview([str(imported_store), str(out), "--center", "24.9443,60.1716", "--zoom", "15", "--size", "300x200"])
    image = Image.open(out).convert("RGB")
    assert image.size == (300, 200) and len(set(image.get_flattened_data())) > 20
    with pytest.raises(SystemExit):
        preview([str(tmp_path), str(out), "--center", "24.9,60.1"])
