"""The PostGIS production option: ``toposm-import EXTRACT --postgis DSN`` runs osm2pgsql on the extract.

osm2pgsql (Debian package, installed by ``bin/ensure-postgis``) loads its classic pgsql output (tables
``planet_osm_point/line/polygon/roads`` in EPSG:3857) in slim mode, so ``osm2pgsql --append`` can apply
diffs later; ``style_layers`` maps those tables onto the same layers the embedded store has.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .errors import ImportFailed


def import_postgis(extract: Path, dsn: str, *, timeout: float = 3600) -> None:
    """Replace the osm2pgsql tables in ``dsn`` with ``extract``. Raises ImportFailed with osm2pgsql's reason."""
    if not extract.is_file():
        raise ImportFailed(f"{extract}: no such file")
    exe = shutil.which("osm2pgsql")
    if exe is None:
        raise ImportFailed("osm2pgsql is not installed (bin/ensure-postgis installs PostgreSQL, PostGIS, osm2pgsql)")
    cmd = [exe, "--create", "--slim", "--database", dsn, "--number-processes", "1", "--cache", "256",
           "--log-progress", "false", str(extract)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ImportFailed(f"{extract}: osm2pgsql did not finish within {timeout:.0f}s") from exc
    if run.returncode != 0:
        # osm2pgsql logs the cause last; the DSN is not echoed (it may hold a password).
        reason = " | ".join(line.strip() for line in run.stderr.strip().splitlines()[-3:])
        raise ImportFailed(f"{extract}: osm2pgsql failed (exit {run.returncode}): {reason}")
