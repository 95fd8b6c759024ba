"""toposm-replicate keeping a PostGIS store current beside the embedded one, on the real Helsinki extract; the
bridge's expiry checked against osm2pgsql's own (--expire-tiles) for the same diffs, on the extract and on it
scaled 10x (the benchmark's ~1,000-object diff, with route and multipolygon members changed); flat nodes."""

# ruff: noqa: F811 - the fixtures are imported by name and then requested as parameters
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from scaled_store import K, ScaledHelsinki, scaled_helsinki

from demo.osm_changes import NEW_BUILDING_ID, helsinki_edit
from demo.osm_changes import publish as publish_demo
from harness.osm import node_xml, osc, publish, read_extract, renumber, street_node, way_xml
from services.osmstore.importer import main as toposm_import
from services.osmstore.postgis import ExpireOutput, append_postgis, import_postgis, postgis_sequence, psql
from services.osmstore.replication import ReplicationError
from services.replicate.batch import build_batch
from services.replicate.follower import Follower
from services.replicate.sinks import PostgisStore
from services.replicate.source import LocalSource
from services.spark_bridge.expire_job import ExpireParams
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.store_job import StoreJob, run_store_expire
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, postgis_dsn, store  # noqa: F401
from tests.services.spark_bridge.replicate_helpers import (  # noqa: F401 - store_bridge is a fixture
    listen_for_expirations,
    settings,
    store_bridge,
)

MIN_Z, MAX_Z = 14, 16


def metatile(tile: str) -> str:
    z, x, y = (int(v) for v in tile.split("/"))
    return f"{z}/{x >> 3 << 3}/{y >> 3 << 3}"


async def test_postgis_kept_current_and_bridge_expiry_covers_osm2pgsql(
    store_bridge, make_unit, store, helsinki, postgis_dsn, tmp_path
) -> None:
    import_postgis(helsinki, postgis_dsn)  # the same extract as the embedded store
    edit = helsinki_edit(helsinki)  # the demo's edit: a street renamed, a building corner moved, a new building
    source = tmp_path / "replication"
    publish_demo(source, 1, edit.text, "2026-11-24T00:01:00Z")
    # A second minute built on it: the renamed street bends (one of its nodes moves), the new building is renamed.
    extract = read_extract(helsinki)
    refs = extract.ways[edit.streets[0]][0]
    lon, lat = extract.nodes[refs[len(refs) // 2]]
    ring = [NEW_BUILDING_ID + 1 + i for i in range(4)] + [NEW_BUILDING_ID + 1]
    publish(
        source,
        2,
        osc(
            modify=[
                node_xml(refs[len(refs) // 2], lon + 0.0004, lat - 0.0003, version=50),
                way_xml(NEW_BUILDING_ID, ring, {"building": "yes", "name": "Qbroker Hall"}),
            ]
        ),
    )
    published = await listen_for_expirations(make_unit)
    expired = tmp_path / "osm2pgsql-expired.list"
    follower = Follower(
        await make_unit("toposm.replicate"),
        settings(source, store, start=1, postgis=postgis_dsn, expire_output=expired),
    )
    await follower.unit.start()
    assert await follower.catch_up() == [1, 2]
    assert follower.jobs == [(1, 2)]  # both stores were at 0: one merged file for both

    assert postgis_sequence(postgis_dsn) == 2
    assert psql(postgis_dsn, "SELECT count(*) FROM planet_osm_line WHERE name = 'Qbrokerinkatu'") != "0"
    assert psql(postgis_dsn, "SELECT count(*) FROM planet_osm_line WHERE name = 'Mikonkatu'") == "0"
    assert psql(postgis_dsn, f"SELECT name FROM planet_osm_polygon WHERE osm_id = {NEW_BUILDING_ID}") == "Qbroker Hall"

    # Every tile osm2pgsql expires for these diffs, the bridge expired too (as part of a metatile it published).
    ours = {t for body in published for t in body.split(";")}
    theirs = expired.read_text().split()
    assert {int(t.split("/")[0]) for t in theirs} == set(range(MIN_Z, MAX_Z + 1))
    missing = sorted({metatile(t) for t in theirs} - ours)
    assert not missing, f"osm2pgsql expired metatiles the bridge did not: {missing[:10]}"

    # A restart applies nothing again, to either store.
    again = Follower(follower.unit, settings(source, store, postgis=postgis_dsn))
    assert await again.catch_up() == []


async def test_flat_nodes_import_and_append(postgis_dsn, helsinki, tmp_path) -> None:
    compact = tmp_path / "helsinki-compact.osm.pbf"
    node_ids = renumber(helsinki, compact)
    flat = tmp_path / "nodes.flat"
    toposm_import([str(compact), "--postgis", postgis_dsn, "--flat-nodes", str(flat)])
    assert flat.is_file() and psql(postgis_dsn, "SELECT to_regclass('planet_osm_nodes') IS NULL") == "t"
    node, lon, lat = street_node(read_extract(helsinki))
    # Only the node moves: osm2pgsql finds the ways using it and their other nodes' locations in the file.
    publish(tmp_path / "replication", 1, osc(modify=[node_xml(node_ids[node], lon + 0.002, lat, version=90)]))
    batch = await build_batch(LocalSource(tmp_path / "replication"), 1, 1, tmp_path / "spool", published=1)
    with pytest.raises(ReplicationError, match="imported with --flat-nodes"):
        await PostgisStore(postgis_dsn, "file:replication").apply(batch)
    await PostgisStore(postgis_dsn, "file:replication", flat_nodes=flat).apply(batch)
    assert postgis_sequence(postgis_dsn) == 1
    moved = psql(
        postgis_dsn,
        "SELECT count(*) FROM planet_osm_line WHERE name = 'Mannerheimintie' AND ST_DWithin(way, "
        f"ST_Transform(ST_SetSRID(ST_MakePoint({lon + 0.002}, {lat}), 4326), 3857), 1)",
    )
    assert int(moved) >= 1


@pytest.fixture(scope="module")
def helsinki_x10() -> ScaledHelsinki:
    return scaled_helsinki()


def relation_members_changed(scaled: ScaledHelsinki, diff: str, copy: int) -> list[str]:
    """Edits in ``copy`` of objects the diff leaves alone: a member way of a route relation (its tags), a node
    of a multipolygon's member way and a node member of a route (both moved)."""
    scale, src = scaled.scale, scaled.scale.src
    ways = {rank: (refs, version, tags) for rank, refs, version, tags in src.ways}
    nodes = {rank: (lon, lat, version, tags) for rank, lon, lat, version, tags in src.nodes}
    dx, dy = scale.offset(copy)

    def untouched(kind: str, rank: int) -> bool:
        return f' id="{scale.oid(kind, rank, copy)}"' not in diff

    def members(kind: str, of_type: str) -> list[int]:
        return [
            ref
            for _, ms, _, tags in src.relations
            if dict(tags).get("type") == of_type
            for t, ref, _ in ms
            if t == kind and ref in (ways if kind == "w" else nodes) and untouched(kind, ref)
        ]

    edits = []
    route_way = members("w", "route")[0]
    refs, version, tags = ways[route_way]
    edits.append(
        way_xml(
            scale.oid("w", route_way, copy),
            [scale.oid("n", r, copy) for r in refs],
            {**dict(tags), "note": "route member"},
            version + 1,
        )
    )
    outer = next(w for w in members("w", "multipolygon") if all(r in nodes and untouched("n", r) for r in ways[w][0]))
    for node in (ways[outer][0][0], members("n", "route")[0]):
        lon, lat, version, tags = nodes[node]
        edits.append(
            node_xml(scale.oid("n", node, copy), lon + dx + 0.0003, lat + dy - 0.0002, dict(tags), version + 1)
        )
    return edits


@pytest.mark.timeout(1800)  # the first run builds the cached 10x stores: many minutes on a loaded machine
async def test_bridge_expiry_covers_osm2pgsql_on_a_10x_store(
    spark, helsinki_x10: ScaledHelsinki, tmp_path: Path
) -> None:
    """The issue's case: osm2pgsql 1.8 (--slim --append --expire-tiles=16-18) against the bridge's store job,
    on the same ~1,000-object diff over the 10x store. osm2pgsql re-processes the relations of every
    changed way, of every way whose node moved and of every moved node member, and expires their whole
    geometry: the bridge must expire every metatile osm2pgsql does, looking the store up on the driver and
    in Spark alike."""
    scaled = helsinki_x10
    # The benchmark's diff in the first nine copies, the relation members' edits alone in the tenth: over
    # nine cities a thousand edits reach nearly every metatile of z16-18 anyway, in the tenth only the
    # relations reach beyond the edited objects.
    diff = scaled.scale.diff(1, copies=K - 1)
    edits = relation_members_changed(scaled, diff, K - 1)
    text = diff.replace("</osmChange>", f"<modify>{''.join(edits)}</modify></osmChange>")
    source = tmp_path / "replication"
    publish(source, 1001, text)
    batch = await build_batch(LocalSource(source), 1001, 1001, tmp_path / "spool", published=1001)
    store = Path(shutil.copytree(scaled.store, tmp_path / "store"))
    expired = tmp_path / "osm2pgsql-expired.list"
    with scaled.postgis_copy() as dsn:
        append_postgis(batch.path, dsn, expire=ExpireOutput(16, 18, expired))
    theirs = {metatile(t) for t in expired.read_text().split()}

    def bridge(job: StoreJob) -> tuple[dict, set[str]]:
        published: list[str] = []
        ctx = JobContext("test", spark, None, publish=published.append)
        result = run_store_expire(batch.path, job, ExpireParams(16, 18), ctx)
        return result, {t for body in published for t in body.split(";")}

    in_spark, by_spark = bridge(StoreJob(store, None, False, driver_lookup_bytes=0))  # a dry run: nothing applied
    on_driver, by_driver = bridge(StoreJob(store, None, True))
    assert len(theirs) > 100
    missing = sorted(theirs - by_driver)
    assert not missing, f"osm2pgsql expired {len(theirs)} metatiles, the bridge missed {len(missing)}: {missing[:10]}"
    assert by_spark == by_driver
    assert on_driver["inputs"]["parent_relations"] > 0 and on_driver["store"]["applied"] is True
    for count in ("ways", "moved_nodes", "parent_relations", "missing_node_refs"):
        assert in_spark["inputs"][count] == on_driver["inputs"][count], count
    print(f"x10: osm2pgsql {len(theirs)} metatiles, the bridge {len(by_driver)}; {on_driver['inputs']}")
