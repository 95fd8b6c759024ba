"""One osmChange file read whole into memory: what the geometry store and the store-backed expiry need.

The whole file is parsed before anything is applied anywhere, so a diff that breaks half-way (a cut
download, a corrupt element) is refused as a whole and no store sees any of it. When an object appears
more than once (a minutely diff may carry several versions), the highest version wins; equal versions keep
the last one read.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import osmium


class DiffError(ValueError):
    """The osmChange cannot be read; the message names the file and the cause."""


@dataclass(frozen=True)
class DiffNode:
    version: int
    lon: float | None  # None: deleted (replication diffs carry no location for deletions)
    lat: float | None
    deleted: bool


@dataclass(frozen=True)
class DiffWay:
    version: int
    refs: tuple[int, ...]
    deleted: bool


@dataclass(frozen=True)
class DiffRelation:
    version: int
    members: tuple[tuple[str, int, str], ...]  # (type n/w/r, id, role)
    deleted: bool


@dataclass
class OscDiff:
    path: Path
    sha256: str
    nodes: dict[int, DiffNode] = field(default_factory=dict)
    ways: dict[int, DiffWay] = field(default_factory=dict)
    relations: dict[int, DiffRelation] = field(default_factory=dict)

    @property
    def objects(self) -> int:
        return len(self.nodes) + len(self.ways) + len(self.relations)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _osmium_file(path: Path) -> osmium.io.File:
    with path.open("rb") as fh:
        compressed = fh.read(2) == b"\x1f\x8b"
    return osmium.io.File(str(path), "osc.gz" if compressed else "osc")


def _newer(known: DiffNode | DiffWay | DiffRelation | None, version: int) -> bool:
    return known is None or version >= known.version


def read_diff(path: Path) -> OscDiff:
    """Parse ``path`` (.osc or .osc.gz, detected from the content). Raises DiffError on unreadable input."""
    path = Path(path)
    if not path.is_file():
        raise DiffError(f"{path}: no such file")
    diff = OscDiff(path=path, sha256=file_sha256(path))
    try:
        for obj in osmium.FileProcessor(_osmium_file(path)):
            if isinstance(obj, osmium.osm.Node):
                if _newer(diff.nodes.get(obj.id), obj.version):
                    loc = obj.location
                    located = not obj.deleted and loc.valid()
                    diff.nodes[obj.id] = DiffNode(obj.version, loc.lon if located else None,
                                                  loc.lat if located else None, obj.deleted or not located)
            elif isinstance(obj, osmium.osm.Way):
                if _newer(diff.ways.get(obj.id), obj.version):
                    diff.ways[obj.id] = DiffWay(obj.version, tuple(n.ref for n in obj.nodes), obj.deleted)
            elif isinstance(obj, osmium.osm.Relation) and _newer(diff.relations.get(obj.id), obj.version):
                members = tuple((m.type, m.ref, m.role) for m in obj.members)
                diff.relations[obj.id] = DiffRelation(obj.version, members, obj.deleted)
    except (RuntimeError, ValueError, OSError, EOFError, gzip.BadGzipFile) as exc:  # libosmium's parse errors
        raise DiffError(f"{path}: unreadable osmChange ({exc})") from exc
    return diff
