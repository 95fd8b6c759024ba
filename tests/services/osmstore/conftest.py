"""Real OSM data for the osmstore tests: the Helsinki extract (bin/ensure-osm-data) imported once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness.osm import osm_data_dir, postgis_database
from harness.pytest_plugin import heavy
from services.osmstore.importer import import_extract
from services.osmstore.render_db import INDEX_GRID, index_box
from services.osmstore.rtree_pack import as_stored
from services.osmstore.wkb import wkb_bbox


@pytest.fixture(scope="session")
@heavy("the real OSM extracts: a test that takes them imports or reads one whole")
def osm_data() -> Path:
    return osm_data_dir()


@pytest.fixture(scope="session")
def helsinki(osm_data: Path) -> Path:
    return osm_data / "Helsinki.osm.pbf"


@pytest.fixture(scope="session")
@heavy("imports the Helsinki extract")
def imported_store(helsinki: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store imported once; tests that change it take ``store`` (a copy) instead."""
    store = tmp_path_factory.mktemp("imported") / "helsinki"
    import_extract(helsinki, store)
    return store


@pytest.fixture
def store(imported_store: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(imported_store, copy)
    return copy


@pytest.fixture(scope="module")
@heavy("a PostGIS database (bin/ensure-postgis starts PostgreSQL)")
def postgis_dsn() -> Iterator[str]:
    """A database of its own per test module (bin/ensure-postgis installs and starts what is missing)."""
    db = f"toposm_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    yield postgis_database(db)
    # WITH (FORCE): mapnik's postgis plugin keeps its pooled connections open
    subprocess.run(
        [
            "psql",
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            f"DROP DATABASE IF EXISTS {db} WITH (FORCE)",
        ],
        capture_output=True,
        timeout=60,
    )


def index_entry(geom: bytes, grid: float = INDEX_GRID) -> list[float]:
    """The R*Tree entry (xmin, ymin, xmax, ymax, as stored) a feature of geometry ``geom`` should have."""
    minx, miny, maxx, maxy = index_box(*wkb_bbox(geom), grid)
    low, high = as_stored(np.array([minx, miny]), up=False), as_stored(np.array([maxx, maxy]), up=True)
    return [*low.tolist(), *high.tolist()]
