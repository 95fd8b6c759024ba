"""A pytest plugin for tests/test_heavy_marker.py (``-p tests.collection_report``): what a collection selected
and deselected, each test with its fixtures and whether it is marked heavy, written as JSON to the file that
``QBROKER_COLLECTION_REPORT`` names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

_deselected: list[pytest.Item] = []


def _describe(items: list[pytest.Item]) -> dict[str, dict[str, Any]]:
    return {
        item.nodeid: {
            "fixtures": sorted(getattr(item, "fixturenames", [])),
            "heavy": item.get_closest_marker("heavy") is not None,
        }
        for item in items
    }


def pytest_deselected(items: list[pytest.Item]) -> None:
    _deselected.extend(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    report = {"selected": _describe(session.items), "deselected": _describe(_deselected)}
    Path(os.environ["QBROKER_COLLECTION_REPORT"]).write_text(json.dumps(report))
