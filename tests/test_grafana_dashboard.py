"""docs/grafana/toposm-tiles.json is a dashboard Grafana imports, and every metric it queries belongs to a program
whose metrics test checks that the program exposes it (tests/services/tiles/test_program_metrics.py: the queuemaster, a
renderer, toposm-replicate, toposm-web and qbroker-dead-letter with the library's;
tests/services/spark_bridge/test_bridge_metrics.py: the Spark bridge)."""

from __future__ import annotations

from tests.grafana_dashboard import PREFIXES, load, queried

CHECKED_BY_THE_TILES_TEST = ("toposm_", "qbroker_")
CHECKED_BY_THE_BRIDGE_TEST = ("spark_bridge_",)


def test_the_dashboard_is_well_formed() -> None:
    dashboard = load()
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_every_queried_metric_is_checked_against_a_service() -> None:
    names = queried()
    assert len(names) >= 20
    assert all(name.startswith(PREFIXES) for name in names)
    unchecked = {n for n in names if not n.startswith(CHECKED_BY_THE_TILES_TEST + CHECKED_BY_THE_BRIDGE_TEST)}
    assert not unchecked
