"""One warm local SparkSession for the whole Spark suite, plus input-file helpers."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.osm import Extract, read_extract
from harness.pytest_plugin import heavy
from services.spark_bridge.limits import BridgeLimits
from services.spark_bridge.service import SparkBridge
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, store  # noqa: F401 - fixtures

# pyspark warns about pandas 3 on import of its pandas helpers; the bridge does not use pandas.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning")


@pytest.fixture(scope="session")
@heavy("starts a local Spark session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("qbroker-spark-bridge-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
async def bridge(make_unit, spark, tmp_path):
    """An in-process bridge on the shared local session: one job at a time, fast progress alerts."""
    unit = await make_unit("spark.bridge")
    # Inputs come from the test's own directory; the big cancel test needs ceilings above the defaults.
    limits = BridgeLimits(max_tiles=10**10, max_tiles_per_geometry=10**10)
    service = SparkBridge(
        unit, spark, tmp_path / "state", max_jobs=1, progress_interval=0.3, input_roots=[tmp_path], limits=limits
    )
    await unit.start()
    yield service
    await service.close()


@pytest.fixture
async def client(make_unit):
    unit = await make_unit("test.spark.client")
    await unit.start()
    return unit


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:  # noqa: F811 - the osmstore fixture imported above
    return read_extract(helsinki)
