"""The ``heavy`` marker, decided by what a test uses rather than by a list of files (docs/testing.md).

A fixture that starts something heavy (a Spark session, a browser, an OSM import, PostGIS, the RabbitMQ
cluster, the original QBroker's environment) says so where it is defined::

    @pytest.fixture(scope="session")
    @heavy("starts a local Spark session")
    def spark() -> Iterator[SparkSession]: ...

and every test whose fixtures include it, directly or through other fixtures, is marked ``heavy`` at
collection, before ``-m "not heavy"`` deselects (``bin/test --quick``). A test that starts something heavy
itself, without a fixture, carries ``@pytest.mark.heavy`` with a comment saying what.

tests/conftest.py loads this module (``pytest_plugins``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

Function = TypeVar("Function", bound=Callable[..., Any])

# Where a fixture function keeps why it is heavy (set by ``heavy``).
HEAVY_BECAUSE = "heavy_because"


def heavy(why: str) -> Callable[[Function], Function]:
    """Mark a fixture function (put it under ``@pytest.fixture``) as one that makes its tests heavy."""

    def mark(function: Function) -> Function:
        setattr(function, HEAVY_BECAUSE, why)
        return function

    return mark


def heavy_reasons(item: pytest.Item) -> list[str]:
    """Why ``item`` is heavy by its fixtures (empty: it is not)."""
    reasons = []
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is not None:
        for name in item.fixturenames:  # type: ignore[attr-defined]
            definitions = fixture_info.name2fixturedefs.get(name)
            if definitions:  # the one in effect for this test is the last (the closest override)
                why = getattr(definitions[-1].func, HEAVY_BECAUSE, None)
                if why:
                    reasons.append(f"{name}: {why}")
    return reasons


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("heavy") is None and heavy_reasons(item):
            item.add_marker(pytest.mark.heavy)
