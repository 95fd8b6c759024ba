"""OSM data for tests and benchmarks: the real extract read independently of the stores (pyosmium), and the
one writer of osmChange files (plain XML, gzipped when the name ends in .gz)."""

from __future__ import annotations

import gzip
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import quoteattr

import osmium

from services.osmstore.replication import publish_diff

ROOT = Path(__file__).resolve().parents[1]


def osm_data_dir() -> Path:
    """The directory of the real extracts (bin/ensure-osm-data puts them there, from the repository: no download)."""
    out = subprocess.run([str(ROOT / "bin" / "ensure-osm-data")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"bin/ensure-osm-data failed: {out.stderr}")
    return ROOT / out.stdout.strip()


def helsinki_extract() -> Path:
    return osm_data_dir() / "Helsinki.osm.pbf"


def postgis_database(name: str) -> str:
    """A PostGIS database called ``name`` (bin/ensure-postgis installs and starts what is missing); its DSN."""
    out = subprocess.run([str(ROOT / "bin" / "ensure-postgis"), name], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"bin/ensure-postgis (PostgreSQL, PostGIS, osm2pgsql) failed: {out.stderr}")
    return out.stdout.strip().splitlines()[-1]


@dataclass
class Extract:
    nodes: dict[int, tuple[float, float]] = field(default_factory=dict)
    ways: dict[int, tuple[list[int], dict[str, str]]] = field(default_factory=dict)
    relations: dict[int, tuple[list[tuple[str, int, str]], dict[str, str]]] = field(default_factory=dict)


def read_extract(path: Path) -> Extract:
    ex = Extract()
    for obj in osmium.FileProcessor(str(path)):
        tags = {t.k: t.v for t in obj.tags}
        if obj.is_node():
            ex.nodes[obj.id] = (obj.location.lon, obj.location.lat)
        elif obj.is_way():
            ex.ways[obj.id] = ([n.ref for n in obj.nodes], tags)
        elif obj.is_relation():
            ex.relations[obj.id] = ([(m.type, m.ref, m.role) for m in obj.members], tags)
    return ex


def street_node(extract: Extract, name: str = "Mannerheimintie") -> tuple[int, float, float]:
    """The second node of the lowest-id highway called ``name``: (id, lon, lat)."""
    street = next(
        w for w, (_refs, tags) in sorted(extract.ways.items()) if tags.get("name") == name and tags.get("highway")
    )
    node = extract.ways[street][0][1]
    lon, lat = extract.nodes[node]
    return node, lon, lat


def _tags(tags: dict[str, str]) -> str:
    return "".join(f"<tag k={quoteattr(k)} v={quoteattr(v)}/>" for k, v in tags.items())


def node_xml(
    nid: int, lon: float | None, lat: float | None, tags: dict[str, str] | None = None, version: int = 2
) -> str:
    """A node; without lon/lat as replication diffs carry deletions."""
    where = f' lat="{lat:.7f}" lon="{lon:.7f}"' if lon is not None and lat is not None else ""
    return f'<node id="{nid}" version="{version}"{where}>{_tags(tags or {})}</node>'


def way_xml(wid: int, refs: list[int], tags: dict[str, str] | None = None, version: int = 2) -> str:
    nds = "".join(f'<nd ref="{r}"/>' for r in refs)
    return f'<way id="{wid}" version="{version}">{nds}{_tags(tags or {})}</way>'


def relation_xml(
    rid: int, members: list[tuple[str, int, str]], tags: dict[str, str] | None = None, version: int = 2
) -> str:
    """A relation; ``members`` as (type, ref, role)."""
    mxml = "".join(f'<member type="{t}" ref="{ref}" role={quoteattr(role)}/>' for t, ref, role in members)
    return f'<relation id="{rid}" version="{version}">{mxml}{_tags(tags or {})}</relation>'


@dataclass
class OscNode:
    """A node as an object (``str()`` is its XML), for tests that build diffs from data."""

    id: int
    lon: float | None
    lat: float | None
    version: int = 2

    def __str__(self) -> str:
        return node_xml(self.id, self.lon, self.lat, version=self.version)


@dataclass
class OscWay:
    id: int
    refs: list[int] = field(default_factory=list)
    version: int = 2

    def __str__(self) -> str:
        return way_xml(self.id, self.refs, version=self.version)


def osc_blocks(blocks: Iterable[tuple[str, Iterable[object]]]) -> str:
    """An osmChange of ``(action, items)`` blocks in this order (a merged diff repeats actions); items are XML
    strings or OscNode/OscWay."""
    parts = ['<?xml version="1.0" encoding="UTF-8"?>\n<osmChange version="0.6" generator="tests">']
    for action, items in blocks:
        text = "\n".join(map(str, items))
        if text:
            parts.append(f"<{action}>{text}</{action}>")
    parts.append("</osmChange>\n")
    return "\n".join(parts)


def osc(create: Iterable[object] = (), modify: Iterable[object] = (), delete: Iterable[object] = ()) -> str:
    return osc_blocks((("create", create), ("modify", modify), ("delete", delete)))


def write_osc(
    path: Path,
    text: str | None = None,
    *,
    create: Iterable[object] = (),
    modify: Iterable[object] = (),
    delete: Iterable[object] = (),
) -> Path:
    """Write ``text`` (or ``osc(create, modify, delete)``) to ``path``, gzipped if its name ends in .gz."""
    data = (osc(create, modify, delete) if text is None else text).encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def publish(source: Path, sequence: int, text: str | bytes) -> Path:
    """Publish an osmChange (text, or the bytes of a .osc.gz, cut short ones included) as replication diff
    ``sequence`` of ``source``, stamped a minute per sequence."""
    data = text if isinstance(text, bytes) else gzip.compress(text.encode())
    return publish_diff(source, sequence, data, f"2026-11-24T00:{sequence:02d}:00Z")


def coastline_node(extract: Extract) -> int:
    """A node in the middle of a coastline way, located in the extract."""
    return next(
        refs[len(refs) // 2]
        for _, (refs, tags) in sorted(extract.ways.items())
        if tags.get("natural") == "coastline" and refs[len(refs) // 2] in extract.nodes
    )


def renumber(extract: Path, out: Path) -> dict[int, int]:
    """The extract with ids 1..N per type (a flat-nodes file is 8 bytes per id up to the highest: 190 KB, not
    the 48 GB today's node ids would take). Returns the node id map."""
    ids: dict[str, dict[int, int]] = {"n": {}, "w": {}, "r": {}}
    for obj in osmium.FileProcessor(str(extract)):
        table = ids[obj.type_str()]
        table[obj.id] = len(table) + 1
    writer = osmium.SimpleWriter(str(out))
    for obj in osmium.FileProcessor(str(extract)):
        if obj.is_node():
            writer.add_node(obj.replace(id=ids["n"][obj.id]))
        elif obj.is_way():
            writer.add_way(
                obj.replace(id=ids["w"][obj.id], nodes=[ids["n"][n.ref] for n in obj.nodes if n.ref in ids["n"]])
            )
        else:
            members = [(m.type, ids[m.type][m.ref], m.role) for m in obj.members if m.ref in ids[m.type]]
            writer.add_relation(obj.replace(id=ids["r"][obj.id], members=members))
    writer.close()
    return ids["n"]
