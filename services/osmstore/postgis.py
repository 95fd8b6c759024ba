"""The PostGIS production option: ``toposm-import EXTRACT --postgis DSN`` runs osm2pgsql on the extract.

osm2pgsql (Debian package, installed by ``bin/ensure-postgis``) loads its classic pgsql output (tables
``planet_osm_point/line/polygon/roads`` in EPSG:3857) in slim mode, so ``osm2pgsql --append`` can apply
diffs later; ``style_layers`` maps those tables onto the same layers the embedded store has.
``toposm-replicate --postgis DSN`` keeps it current with ``append_postgis`` (``osm2pgsql --append``).

With ``--flat-nodes FILE`` node locations go to a file indexed by node id instead of a database table,
as operators of countries and the planet do: the file is 8 bytes times the highest node id, written
in full by osm2pgsql (the planet's ~90 GB; but also ~48 GB for a city extract with today's node ids).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .errors import ImportFailed, StoreUnavailable


def import_postgis(extract: Path, dsn: str, *, flat_nodes: Path | None = None, timeout: float = 3600) -> None:
    """Replace the osm2pgsql tables in ``dsn`` with ``extract``. Raises ImportFailed with osm2pgsql's reason."""
    if not extract.is_file():
        raise ImportFailed(f"{extract}: no such file")
    _osm2pgsql(["--create", *_flat(flat_nodes)], extract, dsn, timeout)


_RUNNING: set[subprocess.Popen[str]] = set()  # osm2pgsql and psql runs in progress, in any thread
_RUNNING_LOCK = threading.Lock()


def _run(cmd: list[str], timeout: float, script: str | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True)`` that ``stop_running`` can end from another thread.
    TimeoutExpired (the child killed) past ``timeout``."""
    with _RUNNING_LOCK:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL if script is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _RUNNING.add(proc)
    try:
        with proc:
            try:
                out, err = proc.communicate(script, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop_running() -> int:
    """End the osm2pgsql and psql runs in progress (a follower stopping: osm2pgsql may take an hour, a
    hanging database as long as the timeout); each fails as StoreUnavailable. Returns how many."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        with contextlib.suppress(OSError):
            proc.terminate()
    return len(running)


def _osm2pgsql(mode: list[str], data: Path, dsn: str, timeout: float) -> None:
    """Run osm2pgsql: ImportFailed when it cannot run, StoreUnavailable when it ran and failed."""
    exe = shutil.which("osm2pgsql")
    if exe is None:
        raise ImportFailed("osm2pgsql is not installed (bin/ensure-postgis installs PostgreSQL, PostGIS, osm2pgsql)")
    cmd = [
        exe,
        *mode,
        "--slim",
        "--database",
        dsn,
        "--number-processes",
        "1",
        "--cache",
        "256",
        "--log-progress",
        "false",
        str(data),
    ]
    try:
        run = _run(cmd, timeout)
    except subprocess.TimeoutExpired:  # not chained: its message quotes the command line, DSN and password
        raise StoreUnavailable(f"{data}: osm2pgsql did not finish within {timeout:.0f}s") from None
    if run.returncode != 0:
        # osm2pgsql logs the cause last; the DSN is not echoed (it may hold a password).
        reason = " | ".join(line.strip() for line in run.stderr.strip().splitlines()[-3:])
        raise StoreUnavailable(f"{data}: osm2pgsql failed (exit {run.returncode}): {reason}")


# osm2pgsql-replication's record of progress (url, sequence, importdate): the same table, so either tool can
# take over from the other and `osm2pgsql-replication status` reports a store toposm-replicate keeps.
REPLICATION_TABLE = "planet_osm_replication_status"


@dataclass(frozen=True)
class ExpireOutput:
    """osm2pgsql's own expiry: every tile from ``min_zoom`` to ``max_zoom`` a diff touched, appended to ``path``."""

    min_zoom: int
    max_zoom: int
    path: Path


def append_postgis(
    osc: Path, dsn: str, *, flat_nodes: Path | None = None, expire: ExpireOutput | None = None, timeout: float = 3600
) -> None:
    """Apply an osmChange (sorted, as osm2pgsql needs) with ``osm2pgsql --append --slim``. Raises ImportFailed.

    ``flat_nodes`` must be the file the import used (node locations live there, not in the database)."""
    if flat_nodes is None and _uses_flat_nodes(dsn):
        raise ImportFailed("the PostGIS store was imported with --flat-nodes (no planet_osm_nodes): pass the same file")
    if flat_nodes is not None and not flat_nodes.is_file():
        raise ImportFailed(f"--flat-nodes {flat_nodes}: no such file (it is written by the import)")
    extra = (
        ["--expire-tiles", f"{expire.min_zoom}-{expire.max_zoom}", "--expire-output", str(expire.path)]
        if expire is not None
        else []
    )
    _osm2pgsql(["--append", *_flat(flat_nodes), *extra], osc, dsn, timeout)


def postgis_sequence(dsn: str) -> int | None:
    """The replication sequence recorded in the PostGIS store, or None when it has none yet."""
    if psql(dsn, "SELECT to_regclass(:'tab') IS NOT NULL", tab=REPLICATION_TABLE) != "t":
        return None
    out = psql(dsn, "SELECT sequence FROM planet_osm_replication_status LIMIT 1")
    return int(out) if out.isdigit() else None


def record_postgis_sequence(dsn: str, url: str, sequence: int, timestamp: str | None) -> None:
    """Record the last applied diff, as osm2pgsql-replication does (one row; importdate = the diff's timestamp)."""
    psql(dsn, _RECORD_SEQUENCE, url=url, seq=str(int(sequence)), stamp=_iso_or_empty(timestamp))


def _iso_or_empty(timestamp: str | None) -> str:
    """The state file's timestamp if it is one (it comes from the replication server), else '' (NULL)."""
    try:
        return datetime.fromisoformat((timestamp or "").replace("Z", "+00:00")).isoformat()
    except ValueError:
        return ""


_RECORD_SEQUENCE = """BEGIN;
CREATE TABLE IF NOT EXISTS planet_osm_replication_status (url TEXT, sequence INTEGER, importdate TIMESTAMPTZ);
DELETE FROM planet_osm_replication_status;
INSERT INTO planet_osm_replication_status VALUES (:'url', :'seq'::integer, NULLIF(:'stamp', '')::timestamptz);
COMMIT;"""


def psql(dsn: str, script: str, *, timeout: float = 300, **variables: str) -> str:
    """Run ``script`` (psql variables ``:'name'`` quoted by psql) and return its trimmed output. ImportFailed
    when psql is missing, StoreUnavailable when it fails or hangs past ``timeout`` (a lock wait, a server
    that accepts and never answers: the follower backs off)."""
    exe = shutil.which("psql")
    if exe is None:
        raise ImportFailed("psql is not installed (bin/ensure-postgis installs PostgreSQL)")
    cmd = [exe, "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-d", dsn]
    for key, value in variables.items():
        cmd += ["-v", f"{key}={value}"]
    try:
        run = _run(cmd, timeout, script)
    except subprocess.TimeoutExpired:  # not chained: its message quotes the command line, DSN and password
        raise StoreUnavailable(f"psql did not finish within {timeout:.0f}s") from None
    if run.returncode != 0:
        raise StoreUnavailable(f"psql failed (exit {run.returncode}): {run.stderr.strip()[-300:]}")
    return run.stdout.strip()


def _uses_flat_nodes(dsn: str) -> bool:
    # With --flat-nodes osm2pgsql (1.8, Debian 12) creates no planet_osm_nodes table.
    return (
        psql(dsn, "SELECT to_regclass('planet_osm_ways') IS NOT NULL AND to_regclass('planet_osm_nodes') IS NULL")
        == "t"
    )


def _flat(flat_nodes: Path | None) -> list[str]:
    return ["--flat-nodes", str(flat_nodes)] if flat_nodes is not None else []
