"""The osmChange reader's version rule, as each adapter applies it: the highest version wins; of equal
versions the last one read (osc_input.supersedes). A merged or hand-made diff may carry an object twice."""

from __future__ import annotations

from pathlib import Path

from harness.osm import node_xml, osc, write_osc
from services.osmstore.osc_diff import read_diff
from services.osmstore.osc_input import InputBudget, supersedes
from services.spark_bridge.osc_reader import read_osc


def test_the_rule() -> None:
    assert supersedes(1, None) and supersedes(3, 2) and supersedes(2, 2) and not supersedes(1, 2)


def test_every_adapter_picks_the_same_version(tmp_path: Path) -> None:
    path = write_osc(
        tmp_path / "repeats.osc.gz",
        osc(
            modify=[
                node_xml(1, 24.0, 60.0, version=2),
                node_xml(1, 24.1, 60.1, version=2),  # a tie: the later one
                node_xml(2, 25.0, 61.0, version=3),
                node_xml(2, 25.1, 61.1, version=2),  # the higher one, read first
            ]
        ),
    )
    diff = read_diff(path)
    geometry = {nid: (node.lon, node.lat) for nid, node in diff.nodes.items()}
    spark = read_osc([(path, "repeats.osc.gz")], InputBudget(None), lambda _: None).latest_locations()
    assert geometry == spark == {1: (24.1, 60.1), 2: (25.0, 61.0)}
