"""Real OSM data for the osmstore tests: the Helsinki extract (bin/ensure-osm-data) imported once per session."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from services.osmstore.importer import import_extract

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def osm_data() -> Path:
    out = subprocess.run([str(ROOT / "bin" / "ensure-osm-data")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return ROOT / out.stdout.strip()


@pytest.fixture(scope="session")
def helsinki(osm_data: Path) -> Path:
    return osm_data / "Helsinki.osm.pbf"


@pytest.fixture(scope="session")
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
