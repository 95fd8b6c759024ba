"""The PostGIS production option on the same extract: bin/ensure-postgis, osm2pgsql import, one rendered tile."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import mercantile
import pytest
from PIL import Image

from harness.osm import read_extract
from services.osmstore.importer import ImportFailed, main
from services.osmstore.postgis import import_postgis
from services.osmstore.style import ROAD_COLOURS
from services.tiles.renderer.backends.mapnik_backend import MapnikBackend
from services.tiles.tilemath import Tile
from tests.osmstore.test_render import _middle_of, _share_near


def test_osm2pgsql_import_and_render(postgis_dsn: str, helsinki: Path) -> None:
    main([str(helsinki), "--postgis", postgis_dsn])
    count = subprocess.run(["psql", "-X", "-tA", postgis_dsn, "-c",
                            "SELECT count(*) FROM planet_osm_line WHERE name = 'Mannerheimintie'"],
                           capture_output=True, text=True, timeout=60)
    assert int(count.stdout.strip()) > 0
    lon, lat = _middle_of(read_extract(helsinki), name="Mannerheimintie", highway="primary")
    t = mercantile.tile(lon, lat, 16)
    tile = Tile(16, t.x, t.y)
    image = Image.open(io.BytesIO(MapnikBackend(store=postgis_dsn).render(tile.metatile)[tile])).convert("RGB")
    assert len(set(image.get_flattened_data())) > 20
    assert _share_near(image, ROAD_COLOURS["primary"][0]) > 0.002


def test_osm2pgsql_failure_is_a_clear_error(postgis_dsn: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.osm.pbf"
    bad.write_bytes(b"not osm at all" * 100)
    with pytest.raises(ImportFailed, match="osm2pgsql failed"):
        import_postgis(bad, postgis_dsn)
