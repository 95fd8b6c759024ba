"""The real Helsinki extract scaled 10x, imported into both stores, kept between test runs.

The scaled extract and its diff are the benchmark's (bench/osm_scale_data.py: copies on a grid, ids spread
over the real id ranges; 600 node moves, 300 way edits, 100 new nodes). Writing it and importing it into
the embedded store and, with osm2pgsql, into PostGIS takes minutes on a loaded machine, so all three are
kept: the extract and the embedded store under ``var/test-cache/`` (gitignored), osm2pgsql's import as a
PostgreSQL template database that each test copies (``CREATE DATABASE ... TEMPLATE``, seconds). Each is
keyed by what it is made from (the extract, the scaling code, the store formats), so a change to any of
them builds it again; a build that dies leaves nothing a later run would take for finished (each is built
under a temporary name and renamed when complete).
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.osm import ROOT, helsinki_extract, postgis_database
from services.osmstore import geometry, render_db
from services.osmstore.importer import import_extract
from services.osmstore.postgis import import_postgis

K = 10
CACHE = ROOT / "var" / "test-cache"
SCALE_CODE = ROOT / "bench" / "osm_scale_data.py"


def scale_module() -> ModuleType:
    """bench/osm_scale_data.py (a script directory, not a package): the very code the benchmarks scale with."""
    spec = importlib.util.spec_from_file_location("osm_scale_data", SCALE_CODE)
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:12]


def _psql_admin(sql: str) -> str:
    out = subprocess.run(
        ["psql", "-X", "-q", "-tA", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c", sql],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return out.stdout.strip()


def _database_exists(name: str) -> bool:
    return _psql_admin(f"SELECT 1 FROM pg_database WHERE datname = '{name}'") == "1"


@dataclass
class ScaledHelsinki:
    scale: Any  # osm_scale_data.Scale
    pbf: Path
    store: Path  # the embedded store as imported: copy it before changing it
    template: str  # the PostGIS database osm2pgsql imported the extract into: copy it (``postgis_copy``)

    @contextmanager
    def postgis_copy(self) -> Iterator[str]:
        """A database of its own, copied from the template; dropped afterwards. Its DSN."""
        name = f"toposm_test_x{K}_{uuid.uuid4().hex[:8]}"
        _psql_admin(f"CREATE DATABASE {name} TEMPLATE {self.template}")
        try:
            yield postgis_database(name)
        finally:
            _psql_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def scaled_helsinki() -> ScaledHelsinki:
    """The 10x extract, its embedded store and its PostGIS template: from the cache, built where missing."""
    extract = helsinki_extract()
    module = scale_module()
    data_key = _digest(extract.read_bytes(), SCALE_CODE.read_bytes(), str(K).encode())
    store_key = _digest(
        data_key.encode(), str(geometry.FORMAT_VERSION).encode(), str(render_db.FORMAT_VERSION).encode()
    )
    CACHE.mkdir(parents=True, exist_ok=True)
    scale = module.Scale(module.read_source(extract), K)
    pbf = CACHE / f"helsinki-x{K}-{data_key}.osm.pbf"
    if not pbf.is_file():
        partial = pbf.with_name(f".partial-{uuid.uuid4().hex[:8]}-{pbf.name}")  # libosmium goes by the suffix
        scale.write_pbf(partial)
        partial.replace(pbf)
    store = CACHE / f"store-x{K}-{store_key}"
    if not store.is_dir():
        partial = store.with_name(f".{store.name}.{uuid.uuid4().hex[:8]}")
        import_extract(pbf, partial)
        partial.replace(store)
    template = f"toposm_cache_x{K}_{data_key}"
    if not _database_exists(template):
        building = f"{template}_building"
        _psql_admin(f"DROP DATABASE IF EXISTS {building} WITH (FORCE)")
        import_postgis(pbf, postgis_database(building))
        _psql_admin(f"ALTER DATABASE {building} RENAME TO {template}")
    return ScaledHelsinki(scale, pbf, store, template)
