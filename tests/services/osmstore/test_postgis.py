"""The PostGIS production option on the same extract: bin/ensure-postgis, osm2pgsql import, one rendered tile."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import mercantile
import pytest
from PIL import Image

from harness import HANG
from harness.osm import osc, publish, read_extract
from services.osmstore.errors import StoreUnavailable
from services.osmstore.importer import ImportFailed, main
from services.osmstore.postgis import import_postgis, psql
from services.osmstore.style import ROAD_COLOURS
from services.tiles.renderer.backends.mapnik_backend import MapnikBackend
from services.toposm.tilemath import Tile
from tests.services.osmstore.test_render import _middle_of, _share_near

ROOT = Path(__file__).resolve().parents[3]


def test_osm2pgsql_import_and_render(postgis_dsn: str, helsinki: Path) -> None:
    main([str(helsinki), "--postgis", postgis_dsn])
    count = subprocess.run(
        ["psql", "-X", "-tA", postgis_dsn, "-c", "SELECT count(*) FROM planet_osm_line WHERE name = 'Mannerheimintie'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert int(count.stdout.strip()) > 0
    lon, lat = _middle_of(read_extract(helsinki), name="Mannerheimintie", highway="primary")
    t = mercantile.tile(lon, lat, 16)
    tile = Tile(16, t.x, t.y)
    image = Image.open(io.BytesIO(MapnikBackend(store=postgis_dsn).render(tile.metatile)[tile])).convert("RGB")
    assert len(set(image.get_flattened_data())) > 20
    assert _share_near(image, ROAD_COLOURS["primary"][0]) > 0.002


def test_osm2pgsql_failure_is_a_clear_error(postgis_dsn: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.osm.pbf"
    bad.write_bytes(b"not osm at all" * 100)
    with pytest.raises(ImportFailed, match="osm2pgsql failed"):
        import_postgis(bad, postgis_dsn)


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never says anything: a PostgreSQL that hangs (a lock wait,
    an overloaded server) as libpq sees it. Yields the port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_hanging_database_is_unavailable_and_its_password_stays_out_of_the_error(tmp_path: Path) -> None:
    """osm2pgsql or psql past its timeout: StoreUnavailable, which the follower backs off from (psql's raised
    subprocess.TimeoutExpired, which ended the follower's task), and neither the message nor the traceback
    (the chained exception quotes the command line) holds the DSN's password."""
    diff = tmp_path / "diff.osc"
    diff.write_text('<osmChange version="0.6"></osmChange>\n')
    with _silent_server() as port:
        dsn = f"postgresql://replicator:S3CRET-pw@127.0.0.1:{port}/gis"
        for attempt in (lambda: import_postgis(diff, dsn, timeout=2), lambda: psql(dsn, "SELECT 1", timeout=2)):
            with pytest.raises(StoreUnavailable) as info:
                attempt()
            shown = "".join(traceback.format_exception(info.value))
            assert "did not finish" in shown and "S3CRET" not in shown, shown


def _children(pid: int) -> list[str]:
    """The command names of ``pid``'s child processes (from /proc)."""
    names = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)
            if int(fields[1].split()[1]) == pid:
                names.append(fields[0].split("(", 1)[1])
    return names


def test_replicate_stops_on_sigterm_while_the_database_hangs(amqp_url: str, tmp_path: Path) -> None:
    """toposm-replicate --postgis alone, its database hanging: SIGTERM ends psql (or osm2pgsql, up to an hour)
    and the process within its drain timeout (the round's diffs are applied again at the next start)."""
    source, spool = tmp_path / "source", tmp_path / "spool"
    publish(source, 1, osc())
    with _silent_server() as port:
        env = {**os.environ, "QBROKER_URL": amqp_url, "QBROKER_DRAIN_TIMEOUT": "4", "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "toposm-replicate"),
                "--source",
                str(source),
                "--spool",
                str(spool),
                "--postgis",
                f"postgresql://replicator:pw@127.0.0.1:{port}/gis",
                "--start",
                "1",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + HANG
            while "psql" not in _children(proc.pid):  # it asks the database for its sequence first
                assert proc.poll() is None and time.monotonic() < deadline, "no psql started"
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(HANG)  # a ceiling for a hang: psql alone would take its 300 s
            except subprocess.TimeoutExpired:
                raise AssertionError(f"still running after SIGTERM; children {_children(proc.pid)}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
        assert code == 0, err.decode()[-2000:]
