"""A small, real osmChange file: a street in Port Qbroker is moved and a new footpath drawn."""

from __future__ import annotations

import gzip
from pathlib import Path

from demo.stack import TOWN_LAT, TOWN_LON


def write_town_changes(path: Path) -> Path:
    """Write ``path`` (.osc.gz): four modified nodes, a new way over them, and one way whose nodes the
    diff does not contain (the expiry job must report it as unresolved rather than guess)."""
    nodes = [(-101 - i, TOWN_LON + 0.004 * i, TOWN_LAT + 0.002 * i) for i in range(4)]
    node_xml = "\n".join(
        f'    <node id="{nid}" version="2" timestamp="2026-11-22T00:00:00Z" lat="{lat:.7f}" lon="{lon:.7f}"/>'
        for nid, lon, lat in nodes
    )
    refs = "\n".join(f'      <nd ref="{nid}"/>' for nid, _, _ in nodes)
    xml = f"""<?xml version="1.0" encoding="UTF-8"?>
<osmChange version="0.6" generator="qbroker demo">
  <modify>
{node_xml}
  </modify>
  <create>
    <way id="-201" version="1" timestamp="2026-11-22T00:00:00Z">
{refs}
      <tag k="highway" v="footway"/>
    </way>
    <way id="-202" version="1" timestamp="2026-11-22T00:00:00Z">
      <nd ref="999999001"/>
      <nd ref="999999002"/>
      <tag k="highway" v="service"/>
    </way>
  </create>
</osmChange>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(xml)
    return path
