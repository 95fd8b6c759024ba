"""Read the real extract independently of the store (pyosmium) and write osmChange files for the tests."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import quoteattr

import osmium


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


def _tags(tags: dict[str, str]) -> str:
    return "".join(f"<tag k={quoteattr(k)} v={quoteattr(v)}/>" for k, v in tags.items())


def node_xml(nid: int, lon: float, lat: float, tags: dict[str, str] | None = None, version: int = 2) -> str:
    return (f'<node id="{nid}" version="{version}" lat="{lat:.7f}" lon="{lon:.7f}">'
            f"{_tags(tags or {})}</node>")


def way_xml(wid: int, refs: list[int], tags: dict[str, str], version: int = 2) -> str:
    nds = "".join(f'<nd ref="{r}"/>' for r in refs)
    return f'<way id="{wid}" version="{version}">{nds}{_tags(tags)}</way>'


def osc(create: list[str] = (), modify: list[str] = (), delete: list[str] = ()) -> str:  # type: ignore[assignment]
    parts = ['<?xml version="1.0" encoding="UTF-8"?>\n<osmChange version="0.6" generator="tests">']
    for name, items in (("create", create), ("modify", modify), ("delete", delete)):
        if items:
            parts.append(f"<{name}>" + "\n".join(items) + f"</{name}>")
    parts.append("</osmChange>\n")
    return "\n".join(parts)


def write_osc(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path
