"""One osmChange file read whole into memory: what the geometry store and the store-backed expiry need.

An adapter on the osmChange reader (``osc_input``: the file, its caps and the version rule). The whole file
is parsed before anything is applied anywhere, so a diff that breaks half-way (a cut download, a corrupt
element) is refused as a whole and no store sees any of it. Each object is kept at the version that
``supersedes`` every other one in the file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import osmium

from services.osmstore.osc_input import InputBudget, InputLimits, UnreadableOsc, osm_objects, supersedes


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


def _newer(known: DiffNode | DiffWay | DiffRelation | None, version: int) -> bool:
    return supersedes(version, None if known is None else known.version)


def read_diff(
    path: Path,
    *,
    name: str | None = None,
    limits: InputLimits | None = None,
    check: Callable[[InputBudget], None] | None = None,
) -> OscDiff:
    """Parse ``path`` (.osc or .osc.gz, detected from the content). Raises UnreadableOsc on unreadable input
    (naming the file as ``name``, never quoting it), InputTooLarge past ``limits`` (none: unbounded, for
    the operator's own files); ``check`` is called as reading goes on (a job's cancel, osc_input)."""
    path = Path(path)
    name = str(path) if name is None else name
    if not path.is_file():
        raise UnreadableOsc(f"{name}: no such file")
    diff = OscDiff(path=path, sha256=file_sha256(path))
    for obj in osm_objects(path, name, InputBudget(limits), check):
        if isinstance(obj, osmium.osm.Node):
            if _newer(diff.nodes.get(obj.id), obj.version):
                loc = obj.location
                located = not obj.deleted and loc.valid()
                diff.nodes[obj.id] = DiffNode(
                    obj.version, loc.lon if located else None, loc.lat if located else None, obj.deleted or not located
                )
        elif isinstance(obj, osmium.osm.Way):
            if _newer(diff.ways.get(obj.id), obj.version):
                diff.ways[obj.id] = DiffWay(obj.version, tuple(n.ref for n in obj.nodes), obj.deleted)
        elif isinstance(obj, osmium.osm.Relation) and _newer(diff.relations.get(obj.id), obj.version):
            members = tuple((m.type, m.ref, m.role) for m in obj.members)
            diff.relations[obj.id] = DiffRelation(obj.version, members, obj.deleted)
    return diff
