"""osmChange (.osc / .osc.gz) read into columns on the driver: the Spark expiry job's adapter on the reader
(``services.osmstore.osc_input``: the file, its caps and the version rule).

Diffs are parsed on the driver (not on executors) so that the same code works for local, standalone
and Spark Connect masters without the files having to be visible to executors; minutely/hourly diffs are
small and even a daily diff is a few million objects, which libosmium reads in seconds. The rows are
handed to Spark as Arrow tables.

Deleted nodes: replication diffs usually carry no coordinates for deletions. A deleted node *with* a
location expires its (old) position; one without a location is counted in
``deleted_nodes_without_location`` and expires nothing — without a database there is no way to know where
it was, and the brief says not to guess.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import osmium
import pyarrow as pa

from services.osmstore.osc_input import InputBudget, osm_objects, supersedes


@dataclass
class OscTables:
    """Columnar rows read from one or more osmChange files."""

    node_id: array = field(default_factory=lambda: array("q"))
    node_version: array = field(default_factory=lambda: array("q"))
    node_lon: array = field(default_factory=lambda: array("d"))
    node_lat: array = field(default_factory=lambda: array("d"))
    node_action: list[str] = field(default_factory=list)  # every version of a node read expires its place
    # (way id, node refs) per way version in the diff
    ways: list[tuple[int, array]] = field(default_factory=list)
    ways_without_nodes: list[int] = field(default_factory=list)
    deleted_nodes_without_location: int = 0

    def nodes_table(self) -> pa.Table:
        return pa.table(
            {
                "node_id": pa.array(self.node_id, pa.int64()),
                "version": pa.array(self.node_version, pa.int64()),
                "lon": pa.array(self.node_lon, pa.float64()),
                "lat": pa.array(self.node_lat, pa.float64()),
                "action": pa.array(self.node_action, pa.string()),
            }
        )

    def latest_locations(self) -> dict[int, tuple[float, float]]:
        """Each located node's place at the version that ``supersedes`` the others in the input."""
        latest: dict[int, tuple[int, float, float]] = {}
        for node_id, version, lon, lat in zip(
            self.node_id, self.node_version, self.node_lon, self.node_lat, strict=True
        ):
            known = latest.get(node_id)
            if supersedes(version, None if known is None else known[0]):
                latest[node_id] = (version, lon, lat)
        return {node_id: (lon, lat) for node_id, (_, lon, lat) in latest.items()}


def _action(obj: osmium.osm.OSMObject) -> str:
    # osmChange's create/modify sections are not exposed by libosmium; version 1 means "created".
    if obj.deleted:
        return "delete"
    return "create" if obj.version == 1 else "modify"


def read_osc(
    files: list[tuple[Path, str]],
    budget: InputBudget,
    check: Callable[[InputBudget], None],
    tables: OscTables | None = None,
) -> OscTables:
    """Parse nodes and ways of every (path, name as the caller gave it) into ``tables`` within ``budget``
    (osc_input); raises UnreadableOsc on unparsable input, InputTooLarge past the budget."""
    out = tables or OscTables()
    for path, name in files:
        for obj in osm_objects(path, name, budget, check, osmium.osm.NODE | osmium.osm.WAY):
            if isinstance(obj, osmium.osm.Node):
                if not obj.location.valid():
                    out.deleted_nodes_without_location += 1
                    continue
                out.node_id.append(obj.id)
                out.node_version.append(obj.version)
                out.node_lon.append(obj.location.lon)
                out.node_lat.append(obj.location.lat)
                out.node_action.append(_action(obj))
            elif isinstance(obj, osmium.osm.Way):
                refs = array("q", (n.ref for n in obj.nodes))
                if refs:
                    out.ways.append((obj.id, refs))
                else:
                    out.ways_without_nodes.append(obj.id)
    return out
