"""Writing small osmChange files as plain XML (optionally gzipped) for the tests."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

from qbroker.testing import eventually as qbroker_eventually


@dataclass
class OscNode:
    id: int
    lon: float | None
    lat: float | None
    version: int = 2


@dataclass
class OscWay:
    id: int
    refs: list[int] = field(default_factory=list)
    version: int = 2


def _node_xml(node: OscNode) -> str:
    loc = f' lat="{node.lat:.7f}" lon="{node.lon:.7f}"' if node.lon is not None and node.lat is not None else ""
    return f'  <node id="{node.id}" version="{node.version}"{loc}/>'


def _way_xml(way: OscWay) -> str:
    refs = "".join(f'<nd ref="{r}"/>' for r in way.refs)
    return f'  <way id="{way.id}" version="{way.version}">{refs}</way>'


def write_osc(
    path: Path,
    *,
    create: list[OscNode | OscWay] | None = None,
    modify: list[OscNode | OscWay] | None = None,
    delete: list[OscNode | OscWay] | None = None,
) -> Path:
    parts = ['<?xml version="1.0" encoding="UTF-8"?>', '<osmChange version="0.6" generator="tests">']
    for section, items in (("create", create), ("modify", modify), ("delete", delete)):
        if not items:
            continue
        parts.append(f"<{section}>")
        nodes = [i for i in items if isinstance(i, OscNode)]
        ways = [i for i in items if isinstance(i, OscWay)]
        parts += [_node_xml(n) for n in nodes] + [_way_xml(w) for w in ways]
        parts.append(f"</{section}>")
    parts.append("</osmChange>\n")
    text = "\n".join(parts).encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path


# --- independent tile-math oracle (mercantile) ------------------------------------------------

import math  # noqa: E402

import mercantile  # noqa: E402

_HALF = math.pi * 6378137.0  # half the web-mercator world width in metres


def oracle_point_tiles(lon: float, lat: float, zoom: int, buffer: float = 0.1) -> set[tuple[int, int, int]]:
    """Tiles within ``buffer`` tile of a point, from mercantile's metre projection (clamped, no wrap)."""
    mx, my = mercantile.xy(lon, max(min(lat, 85.0511287798066), -85.0511287798066))
    n = 2**zoom
    fx = (mx + _HALF) / (2 * _HALF) * n
    fy = (_HALF - my) / (2 * _HALF) * n
    xs = range(max(0, math.floor(fx - buffer)), min(n - 1, math.floor(fx + buffer)) + 1)
    ys = range(max(0, math.floor(fy - buffer)), min(n - 1, math.floor(fy + buffer)) + 1)
    tiles = {(zoom, x, y) for x in xs for y in ys}
    centre = mercantile.tile(lon, lat, zoom)
    assert (zoom, centre.x, centre.y) in tiles or not xs or not ys
    return tiles


def oracle_propagate(tiles: set[tuple[int, int, int]], min_zoom: int) -> set[tuple[int, int, int]]:
    out: set[tuple[int, int, int]] = set()
    for z, x, y in tiles:
        out.add((z, x, y))
        for zz in range(min_zoom, z):
            parent = mercantile.parent(mercantile.Tile(x, y, z), zoom=zz)
            out.add((zz, parent.x, parent.y))
    return out


def per_zoom(tiles: set[tuple[int, int, int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for z, _, _ in tiles:
        counts[str(z)] = counts.get(str(z), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def oracle_metatiles(tiles: set[tuple[int, int, int]]) -> set[str]:
    return {f"{z}/{(x // 8) * 8}/{(y // 8) * 8}" for z, x, y in tiles}


async def eventually(predicate, timeout: float = 30.0, step: float = 0.2):
    return await qbroker_eventually(predicate, timeout, step)
