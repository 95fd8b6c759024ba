"""toposm-replicate against an in-process bridge with the Helsinki store: in order, resumed, gap, corrupt."""

# ruff: noqa: F811 - the osmstore fixtures are imported by name and then requested as parameters
from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from harness.osm import Extract, node_xml, osc, publish, read_extract
from services.osmstore.geometry import GeometryStore
from services.osmstore.replication import ReplicationError, ReplicationState, write_state
from services.replicate.batch import build_batch, inflated_size
from services.replicate.follower import Follower
from services.replicate.source import LocalSource
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, store  # noqa: F401 - fixtures
from tests.services.spark_bridge.replicate_helpers import (  # noqa: F401 - store_bridge is a fixture
    edits,
    listen_for_expirations,
    settings,
    store_bridge,
)

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


async def test_follows_in_order_and_resumes_after_a_restart(store_bridge, make_unit, store, extract, tmp_path) -> None:
    source = tmp_path / "replication"
    first, second, third = edits(extract)
    publish(source, 1, first)
    publish(source, 2, second)
    expirations = await listen_for_expirations(make_unit)
    follower = Follower(await make_unit("toposm.replicate"), settings(source, store, start=1))
    await follower.unit.start()
    assert await follower.catch_up() == [1, 2]
    assert follower.jobs == [(1, 2)]  # behind by two: one job of the bridge for both, merged
    assert GeometryStore.of_store(store).sequence == 2
    db = sqlite3.connect(store / "render.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key = 'sequence'").fetchone() == ("2",)
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Qbrokerinkatu'").fetchone()[0] >= 1
    status = json.loads((store / "replication.json").read_text())
    assert status["sequence"] == 2 and status["timestamp"] == "2026-11-24T00:02:00Z"

    # A restart: a new follower (no --start needed now) continues after the store's sequence.
    publish(source, 3, third)
    restarted = Follower(follower.unit, settings(source, store))
    assert await restarted.catch_up() == [3]
    assert await restarted.catch_up() == []  # nothing new: nothing repeated
    manifest = GeometryStore.of_store(store).manifest()
    assert [(a.get("first_sequence"), a["sequence"]) for a in manifest.applied] == [(1, 2), (None, 3)]
    assert manifest.sequence == 3
    assert db.execute("SELECT name FROM buildings WHERE osm_id = 9300000100").fetchone() is not None
    assert expirations  # the bridge published what the queuemaster re-renders

    # A gap: 5 is announced, 4 never arrived. Nothing is applied; the error says which file.
    write_state(source / "state.txt", ReplicationState(5, None))
    with pytest.raises(ReplicationError, match=r"gap: .*000/000/004.osc.gz is missing"):
        await restarted.catch_up()
    # A corrupt diff 4 (cut short): the bridge refuses it whole.
    whole = gzip.compress(
        osc(modify=[node_xml(n, lon, lat + 0.001) for n, (lon, lat) in list(extract.nodes.items())[:3000]]).encode()
    )
    publish(source, 4, whole[: len(whole) // 2])
    commits = GeometryStore.of_store(store).manifest().commits
    with pytest.raises(ReplicationError, match="diff 4 .*unreadable osmChange"):
        await restarted.catch_up()
    assert GeometryStore.of_store(store).manifest().commits == commits
    assert db.execute("SELECT value FROM meta WHERE key = 'sequence'").fetchone() == ("3",)


def test_cli_stops_on_a_gap_with_a_clear_error(store, amqp_url, tmp_path) -> None:
    source = tmp_path / "replication"
    write_state(source / "state.txt", ReplicationState(7, None))
    env = {**os.environ, "QBROKER_URL": amqp_url}
    out = subprocess.run(
        [str(BIN / "toposm-replicate"), "--source", str(source), "--store", str(store), "--start", "6", "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 1, out.stderr
    assert "toposm-replicate: gap:" in out.stderr and "000/000/006.osc.gz is missing" in out.stderr
    missing_start = subprocess.run(
        [str(BIN / "toposm-replicate"), "--source", str(source), "--store", str(store), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert missing_start.returncode == 1 and "pass --start N" in missing_start.stderr


async def test_store_requests_are_confined(store_bridge, make_unit, store, tmp_path) -> None:
    from qbroker import InvalidParams, RequestFailed

    client = await make_unit("test.store.client")
    await client.start()
    diff = tmp_path / "d.osc"
    diff.write_text(osc(modify=[node_xml(1, 24.9, 60.1)]))
    base = {"paths": [str(diff)], "wait": True}
    for name in ("elsewhere", str(tmp_path), "../store", "/etc"):
        with pytest.raises(RequestFailed) as err:
            await client.call("spark.expire", {**base, "store": name}, timeout=60)
        assert err.value.id == "unknown_store" and "configured: ['store']" in str(err.value)
    with pytest.raises(RequestFailed) as err:
        await client.call("spark.expire", {**base, "paths": [str(diff), str(diff)], "store": "store"}, timeout=60)
    assert err.value.id == "bad_input" and "exactly one osmChange" in str(err.value)
    with pytest.raises(InvalidParams, match="only go with store"):
        await client.call("spark.expire", {**base, "sequence": 3}, timeout=60)
    outside = Path("/tmp") / f"outside-{os.getpid()}.osc"
    outside.write_text(osc())
    try:
        with pytest.raises(RequestFailed) as err:
            await client.call("spark.expire", {**base, "paths": [str(outside)], "store": "store"}, timeout=60)
        assert err.value.id == "input_not_allowed"
    finally:
        outside.unlink()


async def test_a_diff_inflating_past_the_cap_is_refused_before_it_is_merged(tmp_path: Path) -> None:
    """A replication server may send a gzip bomb: a batch counts what its diffs inflate to before libosmium
    holds them, ends before a diff that would pass the cap, and refuses one that passes it alone."""
    source = tmp_path / "replication"
    publish(source, 1, osc(modify=[node_xml(1, 24.94, 60.17, {}, 2)]))
    bomb = gzip.compress(b"<osmChange>" + b" " * (8 << 20))  # 8 MiB of XML in ~8 KB
    assert len(bomb) < 64 * 1024
    publish(source, 2, bomb)
    cap = 1 << 20
    batch = await build_batch(LocalSource(source), 1, 2, tmp_path / "spool", published=2, max_inflated=cap)
    assert (batch.first, batch.last) == (1, 1)
    with pytest.raises(ReplicationError, match=rf"diff 2 \(.*002\.osc\.gz\): over {cap} bytes uncompressed"):
        await build_batch(LocalSource(source), 2, 2, tmp_path / "spool", published=2, max_inflated=cap)
    # Counted over every gzip member, plain XML as it is, and only just past the cap.
    assert inflated_size(gzip.compress(b"a" * 10) + gzip.compress(b"b" * 20), 100) == 30
    assert inflated_size(b"<osmChange/>", 5) == 12
    assert cap < inflated_size(bomb, cap) <= cap + (1 << 20)
    with pytest.raises(zlib.error):
        inflated_size(gzip.compress(os.urandom(4096))[:-100], 1 << 20)
