"""Shared by the toposm-replicate tests: an in-process bridge on the Helsinki store, publishing diffs, edits."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.osm import Extract, node_xml, osc, way_xml
from services.replicate.follower import FollowSettings
from services.spark_bridge.limits import BridgeLimits
from services.spark_bridge.service import SparkBridge


@pytest.fixture
async def store_bridge(make_unit, spark, tmp_path, store):
    unit = await make_unit("spark.bridge")
    limits = BridgeLimits(max_tiles=10**8, max_tiles_per_geometry=10**8)
    service = SparkBridge(
        unit, spark, tmp_path / "state", max_jobs=1, input_roots=[tmp_path], limits=limits, stores=[store]
    )
    await unit.start()
    yield service
    await service.close()


async def listen_for_expirations(make_unit) -> list[str]:
    """The bodies of the expire_toposm alerts the bridge publishes from now on (``z/x/y;z/x/y...``)."""
    bodies: list[str] = []
    listener = await make_unit("test.replicate.listener")

    @listener.on_alert("expire_toposm")
    async def on_expire(body: str) -> None:
        bodies.append(body)

    await listener.start()
    return bodies


def street(extract: Extract) -> tuple[int, list[int], dict[str, str]]:
    """Mikonkatu (the demo's street): its way id, node refs and tags."""
    wid = next(
        w for w, (refs, tags) in sorted(extract.ways.items()) if tags.get("name") == "Mikonkatu" and tags.get("highway")
    )
    refs, tags = extract.ways[wid]
    return wid, refs, tags


def renamed(extract: Extract, name: str, version: int) -> str:
    wid, refs, tags = street(extract)
    return way_xml(wid, refs, {**tags, "name": name}, version=version)


def moved_node(extract: Extract) -> tuple[int, float, float]:
    """A node of Mikonkatu and where the edits move it."""
    node = street(extract)[1][1]
    lon, lat = extract.nodes[node]
    return node, lon + 0.0005, lat + 0.0002


def new_building(first_id: int = 9_300_000_001) -> list[str]:
    corners = [(24.9440, 60.1700), (24.9444, 60.1700), (24.9444, 60.1702), (24.9440, 60.1702)]
    nodes = [node_xml(first_id + i, x, y, version=1) for i, (x, y) in enumerate(corners)]
    ring = [first_id + i for i in range(4)] + [first_id]
    return [*nodes, way_xml(first_id + 99, ring, {"building": "yes"}, version=1)]


def edits(extract: Extract) -> list[str]:
    node, lon, lat = moved_node(extract)
    return [
        osc(modify=[renamed(extract, "Qbrokerinkatu", 2)]),
        osc(modify=[node_xml(node, lon, lat)]),
        osc(create=new_building()),
    ]


def settings(source: Path | str, store: Path, **kw) -> FollowSettings:
    return FollowSettings(
        source=source, store=store, store_name=store.name, min_zoom=14, max_zoom=16, call_timeout=600, **kw
    )
