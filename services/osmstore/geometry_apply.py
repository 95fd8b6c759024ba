"""Apply an osmChange to the geometry store: the diff's rows, by id, in one SQLite transaction.

Deletes and inserts touch only the rows of the diff's objects (and SQLite the B-tree pages holding them),
so the cost follows the diff, not the store. The manifest (sequence, applied digests, counts) is written
in the same transaction: the commit is the one point where the store moves to the next diff, and a
failure or a crash before it leaves the store as it was (the transaction is rolled back; after a crash,
SQLite's WAL recovery does it).

Sequence numbers: a diff with a ``sequence`` must be the next one after the store's (``SequenceGap``
otherwise); one at or below the store's is a replay and changes nothing. A diff without a sequence is
recognised as a replay by its SHA-256 among the last applied ones. A merged diff (several replication
diffs in one, as ``toposm-replicate`` sends when it catches up) covers ``first..sequence``: it is applied
when ``first`` is the next one, a replay when ``sequence`` is already applied, refused otherwise.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from .geometry import MEMBER_INDEXES, GeometryStore, GeometryStoreError, Manifest, SequenceGap, id_list, write_manifest
from .osc_diff import OscDiff


@dataclass(frozen=True)
class Replay:
    """Why a diff is not applied again (the store already holds it)."""

    reason: str


def check_sequence(manifest: Manifest, sequence: int | None, sha256: str, *, first: int | None = None) -> Replay | None:
    """None when the diff is to be applied; a Replay when it already was. Raises SequenceGap.

    ``first``: the first sequence a merged diff covers (default ``sequence``: one diff)."""
    if sequence is None or manifest.sequence is None:
        # No sequence to go by: a diff is recognised by its digest. (With sequences the digest is not
        # used: two replication diffs may well be byte-identical, e.g. two empty minutes.)
        if any(entry.get("sha256") == sha256 for entry in manifest.applied):
            return Replay(f"this diff (sha256 {sha256[:12]}) was already applied")
        return None
    if sequence <= manifest.sequence:
        return Replay(f"sequence {sequence} is already applied (the store is at {manifest.sequence})")
    first = sequence if first is None else first
    if first > manifest.sequence + 1:
        raise SequenceGap(
            f"sequence {first} does not follow the store's {manifest.sequence}: "
            f"diffs {manifest.sequence + 1}..{first - 1} are missing"
        )
    if first <= manifest.sequence:  # part of the range is in the store already: a state we cannot check
        raise SequenceGap(
            f"diffs {first}..{sequence} overlap the store's sequence {manifest.sequence}: "
            f"send {manifest.sequence + 1}..{sequence}"
        )
    return None


def apply_diff(store: GeometryStore, diff: OscDiff, sequence: int | None = None) -> dict[str, object]:
    """Apply ``diff`` under the store's writer lock; see ``apply_locked``."""
    with store.locked() as manifest:
        return apply_locked(store, manifest, diff, sequence)


def apply_locked(
    store: GeometryStore, manifest: Manifest, diff: OscDiff, sequence: int | None = None, *, first: int | None = None
) -> dict[str, object]:
    """Apply ``diff`` (the caller holds ``store.locked()``, which gave ``manifest``).

    Returns what changed, or ``{"applied": False, "replay": reason}`` for a diff the store already holds.
    Raises SequenceGap (nothing applied) or GeometryStoreError.
    """
    replay = check_sequence(manifest, sequence, diff.sha256, first=first)
    if replay is not None:
        return {"applied": False, "replay": replay.reason, "sequence": manifest.sequence}
    return PreparedDiff(store, manifest, diff, sequence, first=first).commit()


class PreparedDiff:
    """A diff written into an open transaction (the caller holds ``store.locked()`` and has checked the
    sequence), committed or rolled back later, exactly once: the Spark bridge writes it while the
    rendering store's update is still being built, and commits it after that one (store_job).
    Raises GeometryStoreError (the store unchanged)."""

    def __init__(
        self, store: GeometryStore, manifest: Manifest, diff: OscDiff, sequence: int | None, *, first: int | None = None
    ) -> None:
        self.store, self.diff = store, diff
        self.sequence = sequence if sequence is not None else manifest.sequence
        self.commits = manifest.commits + 1
        self._writer = store.writer()
        conn = self._writer.__enter__()
        try:
            conn.execute("BEGIN IMMEDIATE")
            deltas = _write_changes(conn, diff)
            counts = dict(manifest.counts)
            for name, delta in deltas.items():
                counts[name] = counts.get(name, 0) + delta
            entry: dict[str, object] = {"sequence": sequence, "sha256": diff.sha256}
            if first is not None and first != sequence:
                entry["first_sequence"] = first
            write_manifest(
                conn,
                Manifest(
                    sequence=self.sequence, counts=counts, applied=[*manifest.applied, entry], commits=self.commits
                ),
            )
        except BaseException as exc:
            self._end(conn, "ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise GeometryStoreError(
                    f"{store.db}: the diff could not be applied ({exc}); the store is unchanged"
                ) from exc
            raise
        self._conn: sqlite3.Connection | None = conn

    def _end(self, conn: sqlite3.Connection, verb: str) -> None:
        try:
            if conn.in_transaction:
                conn.execute(verb)
        except BaseException:
            if conn.in_transaction:  # a failed COMMIT: the kept connection must not stay in it
                conn.execute("ROLLBACK")
            raise
        finally:
            self._conn = None
            self._writer.__exit__(None, None, None)

    def commit(self) -> dict[str, object]:
        assert self._conn is not None, "already committed or rolled back"
        try:
            self._end(self._conn, "COMMIT")
        except sqlite3.Error as exc:
            raise GeometryStoreError(
                f"{self.store.db}: the diff could not be applied ({exc}); the store is unchanged"
            ) from exc
        return {
            "applied": True,
            "sequence": self.sequence,
            "commits": self.commits,
            "nodes": len(self.diff.nodes),
            "ways": len(self.diff.ways),
            "relations": len(self.diff.relations),
        }

    def rollback(self) -> None:
        if self._conn is not None:
            self._end(self._conn, "ROLLBACK")


def _write_changes(conn: sqlite3.Connection, diff: OscDiff) -> dict[str, int]:
    """The diff's objects' rows as the diff has them (each object once: its highest version), the reverse
    index with the ways; returns the change in nodes, ways, way nodes, relations and members.

    Only what differs is written: a node whose location is unchanged (a tag edit), a way whose node list is
    unchanged (a tag edit) and a relation whose members are unchanged keep their
    rows, a way whose list changed moves only the (node, way) pairs it gained or lost in ``node_ways``, and a
    relation whose members changed only the (member, relation) pairs of ``node_relations`` / ``way_relations``.
    In a big store each written row is a page of its own: a tag edit of a 15-node way rewrote 30 index rows.
    """
    old_nodes = {
        i: (lon, lat)
        for i, lon, lat in conn.execute(
            "SELECT id, lon, lat FROM nodes WHERE id IN (SELECT value FROM json_each(?))", (id_list(diff.nodes),)
        )
    }
    old_ways = {
        i: tuple(json.loads(refs))
        for i, refs in conn.execute(
            "SELECT id, nodes FROM ways WHERE id IN (SELECT value FROM json_each(?))", (id_list(diff.ways),)
        )
    }
    old_relations = {
        i: json.loads(members)
        for i, members in conn.execute(
            "SELECT id, members FROM relations WHERE id IN (SELECT value FROM json_each(?))", (id_list(diff.relations),)
        )
    }

    gone_nodes = [(i,) for i, n in diff.nodes.items() if n.deleted and i in old_nodes]
    node_rows = [
        (i, n.lon, n.lat) for i, n in diff.nodes.items() if not n.deleted and old_nodes.get(i) != (n.lon, n.lat)
    ]
    conn.executemany("DELETE FROM nodes WHERE id = ?", gone_nodes)
    conn.executemany("INSERT OR REPLACE INTO nodes (id, lon, lat) VALUES (?, ?, ?)", node_rows)

    lost: set[tuple[int, int]] = set()  # (node, way) pairs of node_ways
    gained: set[tuple[int, int]] = set()
    gone_ways: list[tuple[int]] = []
    way_rows: list[tuple[int, str]] = []
    for w, way in diff.ways.items():
        old = old_ways.get(w)
        if way.deleted:
            if old is not None:
                lost |= {(n, w) for n in old}
                gone_ways.append((w,))
            continue
        if old == way.refs:
            continue
        lost |= {(n, w) for n in old or ()} - {(n, w) for n in way.refs}
        gained |= {(n, w) for n in way.refs} - {(n, w) for n in old or ()}
        way_rows.append((w, _json(list(way.refs))))
    conn.executemany("DELETE FROM node_ways WHERE node_id = ? AND way_id = ?", sorted(lost))
    conn.executemany("DELETE FROM ways WHERE id = ?", gone_ways)
    conn.executemany("INSERT OR REPLACE INTO ways (id, nodes) VALUES (?, ?)", way_rows)
    conn.executemany("INSERT OR IGNORE INTO node_ways (node_id, way_id) VALUES (?, ?)", sorted(gained))

    gone_relations: list[tuple[int]] = []
    relation_rows: list[tuple[int, str]] = []
    lost_members: set[tuple[str, int, int]] = set()  # (type, member, relation) of the member indexes
    gained_members: set[tuple[str, int, int]] = set()
    for r, rel in diff.relations.items():
        members = [list(m) for m in rel.members]
        old_indexed = {(t, m, r) for t, m, *_ in old_relations.get(r, ()) if t in MEMBER_INDEXES}
        if rel.deleted:
            if r in old_relations:
                gone_relations.append((r,))
                lost_members |= old_indexed
        elif old_relations.get(r) != members:
            relation_rows.append((r, _json(members)))
            new_indexed = {(t, m, r) for t, m, _ in rel.members if t in MEMBER_INDEXES}
            lost_members |= old_indexed - new_indexed
            gained_members |= new_indexed - old_indexed
    conn.executemany("DELETE FROM relations WHERE id = ?", gone_relations)
    conn.executemany("INSERT OR REPLACE INTO relations (id, members) VALUES (?, ?)", relation_rows)
    for kind, table in MEMBER_INDEXES.items():
        column = "node_id" if kind == "n" else "way_id"
        conn.executemany(
            f"DELETE FROM {table} WHERE {column} = ? AND rel_id = ?",  # noqa: S608 - constant names
            sorted((m, r) for t, m, r in lost_members if t == kind),
        )
        conn.executemany(
            f"INSERT OR IGNORE INTO {table} ({column}, rel_id) VALUES (?, ?)",  # noqa: S608
            sorted((m, r) for t, m, r in gained_members if t == kind),
        )

    live_ways = [way.refs for way in diff.ways.values() if not way.deleted]
    live_relations = [rel.members for rel in diff.relations.values() if not rel.deleted]
    return {
        "nodes": sum(1 for n in diff.nodes.values() if not n.deleted) - len(old_nodes),
        "ways": len(live_ways) - len(old_ways),
        "way_nodes": sum(map(len, live_ways)) - sum(map(len, old_ways.values())),
        "relations": len(live_relations) - len(old_relations),
        "members": sum(map(len, live_relations)) - sum(map(len, old_relations.values())),
    }


def _json(value: object) -> str:
    """As the import writes it (``opl_columns``): compact, not ASCII-escaped."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
