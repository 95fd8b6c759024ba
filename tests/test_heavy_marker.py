"""The inner loop's rule (docs/testing.md): a test is ``heavy`` by its fixtures (harness/pytest_plugin.py), so
``-m "not heavy"`` (``bin/test --quick``) runs no test that starts Spark, a browser, an OSM import, PostGIS,
the RabbitMQ cluster or the original QBroker, and nobody keeps a list of files for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import HANG

ROOT = Path(__file__).resolve().parents[1]

# The fixtures that start each heavy thing, named here independently of the ``@heavy`` marks on them.
HEAVY_FIXTURES = {
    "spark": "a local Spark session",
    "connect_url": "a Spark Connect server",
    "standalone_master": "a Spark standalone cluster",
    "browser": "a headless Chromium",
    "imported_store": "an OSM import",
    "osm_data": "the real OSM extracts",
    "osm_extracts": "the docs' OSM imports",
    "postgis_dsn": "PostGIS",
    "cluster": "a three-node RabbitMQ cluster",
    "peer_python": "the original QBroker",
}
# One test per kind, which the quick loop must leave out.
KNOWN_HEAVY = (
    "tests/qbroker/core/test_cluster.py::",
    "tests/qbroker/interop/test_original_rpc.py::",
    "tests/qbroker/cli/test_jobs.py::",
    "tests/services/spark_bridge/test_spark_stats_job.py::",
    "tests/services/web/test_web_browser.py::",
    "tests/services/osmstore/test_apply_osc.py::",
    "tests/services/osmstore/test_postgis.py::test_osm2pgsql_import_and_render",
    "tests/services/tiles/test_bus_real_osm.py::",
    "tests/test_demo.py::",
)
# And some that it must keep (the library on both brokers, the CLI, the tiles' queue, web over HTTP).
KNOWN_QUICK = (
    "tests/qbroker/core/test_rpc_basic.py::",
    "tests/qbroker/cli/test_call.py::",
    "tests/services/tiles/test_queuemaster_core.py::",
    "tests/services/web/test_web_http.py::",
)


@pytest.fixture(scope="module")
def quick_collection(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    report = tmp_path_factory.mktemp("collection") / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            "not heavy",
            "-p",
            "tests.collection_report",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        cwd=ROOT,
        env={**os.environ, "QBROKER_COLLECTION_REPORT": str(report)},
        capture_output=True,
        text=True,
        timeout=HANG * 5,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def test_no_quick_test_uses_a_heavy_fixture(quick_collection: dict[str, Any]) -> None:
    found = {
        nodeid: sorted(set(test["fixtures"]) & set(HEAVY_FIXTURES))
        for nodeid, test in quick_collection["selected"].items()
    }
    assert not {nodeid: names for nodeid, names in found.items() if names}


def test_every_test_using_a_heavy_fixture_is_marked_and_deselected(quick_collection: dict[str, Any]) -> None:
    deselected = quick_collection["deselected"]
    by_fixture = {name: [n for n, test in deselected.items() if name in test["fixtures"]] for name in HEAVY_FIXTURES}
    assert all(by_fixture.values()), {name: HEAVY_FIXTURES[name] for name, tests in by_fixture.items() if not tests}
    assert all(test["heavy"] for test in deselected.values() if set(test["fixtures"]) & set(HEAVY_FIXTURES))


def test_the_known_heavy_tests_are_left_out_and_the_light_ones_kept(quick_collection: dict[str, Any]) -> None:
    selected, deselected = quick_collection["selected"], quick_collection["deselected"]
    assert [p for p in KNOWN_HEAVY if not any(n.startswith(p) for n in deselected)] == []
    assert [p for p in KNOWN_HEAVY if any(n.startswith(p) for n in selected)] == []
    assert [p for p in KNOWN_QUICK if not any(n.startswith(p) for n in selected)] == []
