"""toposm-replicate against a replication server over HTTP: catching up in one merged job, a missing diff, a
truncated one, a download cut short and a server that is down (backing off), with the bridge and the
Helsinki store; and the sequence rules of a merged diff."""

# ruff: noqa: F811 - the fixtures are imported by name and then requested as parameters
from __future__ import annotations

import gzip
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness import eventually
from harness.osm import Extract, node_xml, osc, publish, read_extract
from services.osmstore.geometry import GeometryStore, Manifest, SequenceGap
from services.osmstore.geometry_apply import check_sequence
from services.osmstore.replication import diff_path
from services.replicate.follower import BadAnswer, Follower, backoff
from services.replicate.main import parse_args
from tests.services.osmstore.conftest import helsinki, imported_store, osm_data, store  # noqa: F401 - fixtures
from tests.services.spark_bridge.replicate_helpers import (  # noqa: F401 - store_bridge is a fixture
    moved_node,
    new_building,
    renamed,
    settings,
    store_bridge,
)
from tests.services.spark_bridge.replication_server import serving


@pytest.fixture(scope="module")
def extract(helsinki: Path) -> Extract:
    return read_extract(helsinki)


async def test_follows_a_replication_server(store_bridge, make_unit, store, extract, tmp_path) -> None:
    mirror = tmp_path / "mirror"
    minute = mirror / "replication" / "minute"
    node, lon, lat = moved_node(extract)
    # Three minutes: renamed, a node moved, renamed again (a higher version) with a new building.
    first = gzip.compress(osc(modify=[renamed(extract, "Qbrokerinkatu", 2)]).encode())
    publish(minute, 1, first)
    publish(minute, 2, osc(modify=[node_xml(node, lon, lat)]))
    publish(minute, 3, osc(create=new_building(), modify=[renamed(extract, "Replicatorinkatu", 3)]))
    with serving(mirror) as server:
        url = server.url + "replication/minute/"
        follower = Follower(
            await make_unit("toposm.replicate"),
            settings(url, store, start=1, interval=0.05, max_backoff=0.2, http_retries=0),
        )
        await follower.unit.start()
        commits = GeometryStore.of_store(store).manifest().commits
        # Missing: state.txt announces 3, the server has no diff 1 (404): a bad answer, naming the URL.
        diff_path(minute, 1).unlink()
        with pytest.raises(
            BadAnswer,
            match=r"gap: http://127\.0\.0\.1:\d+/replication/minute/"
            r"000/000/001\.osc\.gz is missing",
        ):
            await follower.catch_up()
        # Truncated: diff 1 is there but cut short on the server. Nothing of 1..3 is applied.
        whole = gzip.compress(
            osc(modify=[node_xml(n, x, y + 0.001) for n, (x, y) in list(extract.nodes.items())[:3000]]).encode()
        )
        diff_path(minute, 1).write_bytes(whole[: len(whole) // 2])
        with pytest.raises(BadAnswer, match=r"diff 1 \(http://.*/000/000/001\.osc\.gz\): unreadable osmChange"):
            await follower.catch_up()
        assert GeometryStore.of_store(store).manifest().commits == commits and not follower.jobs

        # Repaired on the server, but it is down for two requests, then cuts the download of diff 1 once:
        # the running follower backs off and retries until the three diffs are in, in one merged job.
        diff_path(minute, 1).write_bytes(first)
        server.down = 2
        server.cut = {"/replication/minute/000/000/001.osc.gz"}
        await follower.start()
        await eventually(lambda: 3 in follower.applied or follower.finished.is_set(), timeout=900, interval=0.1)
        await follower.stop()
        assert follower.error is None and follower.jobs == [(1, 3)]
        assert [what for _path, what in server.log].count("503") == 2 and (
            "/replication/minute/000/000/001.osc.gz",
            "cut",
        ) in server.log
        assert follower.retries == 3  # two rounds without state.txt, one with a cut diff
    db = sqlite3.connect(store / "render.sqlite")
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Replicatorinkatu'").fetchone()[0] >= 1
    assert db.execute("SELECT count(*) FROM roads WHERE name = 'Qbrokerinkatu'").fetchone()[0] == 0
    geometry = sqlite3.connect(store / "geometry" / "geometry.sqlite")  # the one middle
    assert geometry.execute("SELECT lon, lat FROM nodes WHERE id = ?", (node,)).fetchone() == pytest.approx(
        (lon, lat), abs=1e-6
    )
    assert db.execute("SELECT count(*) FROM buildings WHERE osm_id = 9300000100").fetchone()[0] == 1
    manifest = GeometryStore.of_store(store).manifest()
    assert manifest.sequence == 3 and manifest.applied[-1]["first_sequence"] == 1
    assert not list(follower.settings.spool_dir.glob("*.osc.gz"))  # merged files do not pile up


def test_backoff_doubles_up_to_its_ceiling() -> None:
    assert [backoff(n, 60, 900) for n in range(1, 7)] == [60, 120, 240, 480, 900, 900]
    assert backoff(10_000, 0.05, 0.2) == 0.2


def test_source_urls(store: Path, tmp_path: Path) -> None:
    args = ["--store", str(store)]
    assert (
        parse_args(["--source", "https://planet.example/replication/minute", *args]).source
        == "https://planet.example/replication/minute/"
    )
    for bad in (
        "ftp://planet.example/replication/",
        "file:///etc/",
        str(tmp_path),
        "https://user:secret@planet.example/replication/minute/",
    ):
        with pytest.raises(SystemExit):
            parse_args(["--source", bad, *args])


def test_a_merged_diff_must_start_right_after_the_store() -> None:
    at_3 = Manifest(sequence=3, counts={})
    assert check_sequence(at_3, 7, "x", first=4) is None
    assert check_sequence(at_3, 3, "x", first=1) is not None  # all of it is in the store: a replay
    with pytest.raises(SequenceGap, match=r"diffs 4\.\.4 are missing"):
        check_sequence(at_3, 7, "x", first=5)
    with pytest.raises(SequenceGap, match=r"diffs 3\.\.7 overlap the store's sequence 3: send 4\.\.7"):
        check_sequence(at_3, 7, "x", first=3)


def test_cli_once_says_when_the_server_does_not_answer(store: Path, amqp_url: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "toposm-replicate"),
            "--source",
            f"http://127.0.0.1:{port}/replication/minute",
            "--store",
            str(store),
            "--start",
            "1",
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QBROKER_URL": amqp_url},
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert (
        f"toposm-replicate: the source did not answer: http://127.0.0.1:{port}/replication/minute/state.txt"
        in out.stderr
    )
