"""What the rendering store reads and checks before it applies a diff (``render_store.apply_osc``): whether
the store holds the diff already, whether the geometry store is at the same state, and which version of each
object in the diff is applied. ``RenderStoreError`` is how any of them, and ``apply_osc``, refuse.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import osmium

from . import render_db
from .geometry import GeometryStoreError, Manifest
from .osc_input import osm_objects, supersedes
from .render_db import GEOMETRY

_MANIFEST = f"SELECT value FROM {GEOMETRY}.meta WHERE key = 'manifest'"  # noqa: S608


class RenderStoreError(Exception):
    """The store or the diff is unusable; nothing was applied. The message names the file and the problem."""


def diff_plan(osc_path: Path) -> tuple[dict[str, set[int]], set[int]]:
    """A first, cheap read of the diff: the ids of its objects by type (n/w/r), so that the stored state of
    all of them is looked up in a few batched queries, and the positions in the file of the versions to
    apply. An object may appear several times (a minutely diff can carry several versions of it, a merged
    one in any order): the reader's version rule (``osc_input.supersedes``) picks one, as for the geometry
    store, so the two stores end in the same state whatever the order in the file."""
    ids: dict[str, set[int]] = {"n": set(), "w": set(), "r": set()}
    winners: dict[tuple[str, int], tuple[int, int]] = {}  # (type, id) -> (version, position)
    for position, obj in enumerate(osm_objects(osc_path, str(osc_path))):
        if isinstance(obj, osmium.osm.Changeset):
            continue  # not in an osmChange; nothing to apply
        kind = obj.type_str()
        ids[kind].add(obj.id)
        known = winners.get((kind, obj.id))
        if supersedes(obj.version, None if known is None else known[0]):
            winners[(kind, obj.id)] = (obj.version, position)
    return ids, {position for _, position in winners.values()}


def check_in_step(conn: sqlite3.Connection, store_dir: Path) -> None:
    """Refuse a diff unless the geometry store holds the state this store is at (as many diffs committed):
    the diff is laid over that state, and over any other the rebuilt features would be wrong."""
    row = conn.execute(_MANIFEST).fetchone()
    try:
        geometry = Manifest.from_json(row[0]).commits if row is not None else None
    except (GeometryStoreError, ValueError, KeyError, TypeError) as exc:
        raise RenderStoreError(f"{store_dir}: unreadable geometry store manifest ({exc})") from None
    rendering = int(render_db.get_meta(conn, "diffs_applied") or 0)
    if geometry != rendering:
        raise RenderStoreError(
            f"{store_dir}: the geometry store has {geometry} diffs applied and the rendering "
            f"store {rendering}; apply the missing diffs to the geometry store first (this store "
            "reads node locations and way node lists there)"
        )


def already_applied(conn: sqlite3.Connection, sequence: int | None, sha256: str | None) -> bool:
    """By sequence when both the diff and the store have one, else by digest: the geometry store's rule
    (``geometry_apply.check_sequence``). Two replication diffs may be byte-identical (two empty minutes):
    skipping the second by its digest here while the geometry store applied it put the stores out of step."""
    stored = render_db.get_meta(conn, "sequence")
    if sequence is not None and stored is not None and stored.isdigit():
        return int(stored) >= sequence
    return sha256 is not None and render_db.get_meta(conn, "last_diff_sha256") == sha256
