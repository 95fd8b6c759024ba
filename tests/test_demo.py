"""README command one: the demo imports real OSM data, runs the services end to end, applies a replication
diff through the bridge and leaves real map tiles (before and after the edit) on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

from tests.broker import rabbitmqctl


def test_demo_runs_end_to_end(amqp_url: str, tmp_path: Path) -> None:
    env = dict(os.environ, QBROKER_URL=amqp_url)
    result = subprocess.run([sys.executable, "-m", "demo", "--workdir", str(tmp_path)], capture_output=True,
                            text=True, timeout=600, env=env, cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # The operator's view runs from the start: the demo waited for toposm-web to answer before printing this.
    assert "live status page http://127.0.0.1:" in out and "/map" in out
    assert "importing Helsinki.osm.pbf" in out
    assert "17/74618/37938   rendered" in out  # central Helsinki, where the edit is
    assert "applied sequence 1:" in out and "toposm-replicate --once" in out
    expired_line = next(line for line in out.splitlines() if "metatiles expired, " in line)
    expired, rerendered = (int(word) for word in expired_line.split() if word.isdigit())
    assert expired >= 5 and rerendered >= 5
    # The re-rendered tiles show the edit (the renamed street's label, the moved corner, the new building).
    for z in (16, 17):
        changed = next(line for line in out.splitlines() if f"z{z}: before-{z}.png" in line)
        assert int(changed.split("differ in ")[1].split()[0]) > 100, changed
    assert '"command": "stats"' in out  # the CLI's answer
    assert "demo finished: services stopped." in out
    # Each program ran under its own broker account (issue 10), made for the demo and deleted after it.
    assert "broker accounts per program: yes" in out
    accounts = next(line for line in out.splitlines() if line.strip().startswith("accounts:"))
    names = [name.strip() for name in accounts.split(":", 1)[1].split(",")]
    assert len(names) >= 5
    users = rabbitmqctl("list_users", "-q", "--no-table-headers").stdout
    assert not [name for name in names if name in users]
    overview = Image.open(tmp_path / "overview-15.png")
    assert overview.size == (2048, 2048)
    colours = overview.convert("RGB").resize((64, 64)).getcolors(maxcolors=64 * 64) or []
    assert len(colours) > 20  # a map, not a blank
    tiles = list((tmp_path / "tiles").rglob("*.png"))
    assert len(tiles) > 64
