"""How the store expiry job commits a diff to the two stores, on the real Helsinki extract and the shared
local Spark session: diffs in sequence and replays, a guard tripping, a crash between the two commits, a
job cancelled midway, the sea refreshed after a coastline edit. Which tiles a change expires:
test_spark_store_expire.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from store_expire_helpers import MAX_Z, MIN_Z, assert_expires, coords, expect_relations, parents, run, users, whole_ways
from store_oracle import Expected

from harness import HANG
from harness.osm import Extract, coastline_node, node_xml, osc, way_xml, write_osc
from services.osmstore.geometry import GeometryStore
from services.spark_bridge.expire_job import ExpireParams, ExpireTooLarge
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.sea_refresh import SeaRefresher
from services.spark_bridge.store_job import StoreJob, run_store_expire


def test_next_diff_sees_current_geometry_and_replay_changes_nothing(
    spark, store: Path, extract: Extract, tmp_path: Path
) -> None:
    way = whole_ways(extract, highway="unclassified")[0]
    refs, tags = extract.ways[way]
    new = (extract.nodes[refs[0]][0] + 0.002, extract.nodes[refs[0]][1])
    move = write_osc(tmp_path / "1.osc", osc(modify=[node_xml(refs[0], *new)]))
    first, _ = run(spark, store, move, sequence=1)
    assert first["store"]["applied"] is True and first["store"]["sequence"] == 1
    rename = write_osc(tmp_path / "2.osc", osc(modify=[way_xml(way, refs, {**tags, "name": "Uusi"})]))
    second, published = run(spark, store, rename, sequence=2)
    expected = Expected()
    expected.line(coords(extract, refs, {refs[0]: new}), MAX_Z)  # the moved node's *current* place
    for r in parents(extract, [way]):
        for t, ref, _ in extract.relations[r][0]:
            if t == "w" and ref in extract.ways:
                expected.line(coords(extract, extract.ways[ref][0], {refs[0]: new}), MAX_Z)
    assert_expires(published, expected)
    assert GeometryStore.of_store(store).sequence == 2
    again, republished = run(spark, store, move, sequence=1)
    assert again["store"] == {
        "applied": False,
        "sequence": 2,
        "replay": "sequence 1 is already applied (the store is at 2)",
    }
    assert republished == set() and again["total_tiles"] == 0
    with pytest.raises(Exception, match="diffs 3..4 are missing"):
        run(spark, store, write_osc(tmp_path / "5.osc", osc(modify=[node_xml(refs[1], *new)])), sequence=5)
    assert GeometryStore.of_store(store).sequence == 2


@pytest.mark.parametrize("cap", ["max_tiles_per_geometry", "max_tiles"])
def test_a_guard_tripping_applies_nothing(spark, store: Path, extract: Extract, tmp_path: Path, cap: str) -> None:
    way = next(w for w in whole_ways(extract, highway="unclassified") if len(extract.ways[w][0]) >= 4)
    refs, tags = extract.ways[way]
    diff = write_osc(tmp_path / "g.osc", osc(modify=[way_xml(way, refs, {**tags, "name": "Never"})]))
    published: list[str] = []
    ctx = JobContext("test", spark, None, publish=published.append)
    params = ExpireParams(MIN_Z, MAX_Z, **{cap: 3})
    with pytest.raises(ExpireTooLarge, match=cap):
        run_store_expire(diff, StoreJob(store, 1, True), params, ctx)
    assert published == []
    assert GeometryStore.of_store(store).manifest().commits == 0
    db = sqlite3.connect(store / "render.sqlite")
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Never'").fetchone()[0] == 0


def test_rerun_after_a_crash_between_the_two_commits(spark, store: Path, extract: Extract, tmp_path: Path) -> None:
    """The rendering store already holds diff 1 (the bridge died before the geometry commit): running diff 1
    again skips the rendering store, still expires from the old geometry, and commits the geometry store."""
    from services.osmstore.render_store import apply_osc

    way = whole_ways(extract, highway="unclassified")[1]
    refs, tags = extract.ways[way]
    moved = refs[0]
    new = (extract.nodes[moved][0] + 0.001, extract.nodes[moved][1])
    diff = write_osc(tmp_path / "1.osc", osc(modify=[node_xml(moved, *new)]))
    assert "nodes_modified" in apply_osc(store, diff, sequence=1)
    result, published = run(spark, store, diff, sequence=1)
    assert result["store"]["render"] == {"skipped": 1} and result["store"]["applied"] is True
    expected = Expected()
    expected.point(extract.nodes[moved], MAX_Z)
    for w in users(extract, moved):
        expected.line(coords(extract, extract.ways[w][0]), MAX_Z)  # old geometry: from the geometry store
        expected.line(coords(extract, extract.ways[w][0], {moved: new}), MAX_Z)
    expect_relations(expected, extract, parents(extract, [], [moved]), {moved: new})
    assert_expires(published, expected)
    assert GeometryStore.of_store(store).sequence == 1


def test_a_job_stopped_after_the_rendering_store_was_prepared_applies_nothing(
    spark, store: Path, extract: Extract, tmp_path: Path
) -> None:
    """The rendering store's transaction is built while Spark resolves the diff and committed only once the
    expiry succeeded: a job cancelled in between rolls it back and publishes nothing."""
    from services.spark_bridge.job_context import JobCancelled

    way = next(w for w in whole_ways(extract, highway="unclassified") if len(extract.ways[w][0]) >= 4)
    refs, tags = extract.ways[way]
    diff = write_osc(tmp_path / "c.osc", osc(modify=[way_xml(way, refs, {**tags, "name": "Cancelled"})]))

    class CancelAfterResolving(JobContext):
        def count(self, name: str, value: int | float) -> None:
            super().count(name, value)
            if name == "ways":  # the resolution's counts: the rendering store is being prepared meanwhile
                self.cancel_requested.set()

    db = sqlite3.connect(store / "render.sqlite")
    meta_before = db.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
    published: list[str] = []
    ctx = CancelAfterResolving("test", spark, None, publish=published.append)
    with pytest.raises(JobCancelled):
        run_store_expire(diff, StoreJob(store, 1, True), ExpireParams(MIN_Z, MAX_Z), ctx)
    assert published == []
    assert GeometryStore.of_store(store).manifest().commits == 0
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Cancelled'").fetchone()[0] == 0
    assert db.execute("SELECT key, value FROM meta ORDER BY key").fetchall() == meta_before
    # The same diff then goes through whole.
    result, published_now = run(spark, store, diff, sequence=1)
    assert result["store"]["applied"] is True and published_now
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Cancelled'").fetchone()[0] > 0


def test_a_coastline_edit_refreshes_the_sea_and_expires_again(
    spark, store: Path, extract: Extract, tmp_path: Path
) -> None:
    """After the job, the bridge rebuilds the sea in the background and publishes the job's metatiles again
    (tiles re-rendered before the sea was rebuilt show the old one along the edited coast)."""
    nid = coastline_node(extract)
    lon, lat = extract.nodes[nid]
    diff = write_osc(tmp_path / "coast.osc", osc(modify=[node_xml(nid, lon + 0.001, lat)]))
    published: list[str] = []
    sea = SeaRefresher(store)
    result = run_store_expire(
        diff,
        StoreJob(store, 1, True, sea=sea),
        ExpireParams(MIN_Z, MAX_Z),
        JobContext("test", spark, None, publish=published.append),
    )
    assert result["store"]["render"]["sea_stale"] == 1
    assert sea.wait_idle(5 * HANG) and sea.refreshes == 1
    sent = result["published"]["messages"]
    assert sent and published[sent:] == published[:sent]  # the same expirations, once more
    stale = sqlite3.connect(store / "render.sqlite").execute("SELECT value FROM meta WHERE key = 'sea_stale'")
    assert stale.fetchone() is None
