"""Apply an osmChange to the geometry store: copy-on-write partitions, one atomic commit.

The next snapshot is built beside the live one: every partition a changed object falls in is read,
stripped of the changed objects' rows and rewritten with their new rows; every other partition is
hard-linked (no copy). Then ``CURRENT`` is replaced (the commit) and the old snapshot removed. A failure
before the commit leaves the live snapshot as it was; the half-built one is removed on the spot (or at
the next open after a crash).

Sequence numbers: a diff with a ``sequence`` must be the next one after the store's (``SequenceGap``
otherwise); one at or below the store's is a replay and changes nothing. A diff without a sequence is
recognised as a replay by its SHA-256 among the last applied ones. A merged diff (several replication
diffs in one, as ``toposm-replicate`` sends when it catches up) covers ``first..sequence``: it is applied
when ``first`` is the next one, a replay when ``sequence`` is already applied, refused otherwise.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .geometry import (
    PARTITIONING,
    SCHEMAS,
    GeometryStore,
    GeometryStoreError,
    Manifest,
    SequenceGap,
    bucket_dir,
    bucket_of,
    has_files,
    table_bits,
    write_empty,
    write_manifest,
    write_partitioned,
)
from .osc_diff import OscDiff


@dataclass(frozen=True)
class Replay:
    """Why a diff is not applied again (the store already holds it)."""

    reason: str


def check_sequence(manifest: Manifest, sequence: int | None, sha256: str, *,
                   first: int | None = None) -> Replay | None:
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
        raise SequenceGap(f"sequence {first} does not follow the store's {manifest.sequence}: "
                          f"diffs {manifest.sequence + 1}..{first - 1} are missing")
    if first <= manifest.sequence:  # part of the range is in the store already: a state we cannot check
        raise SequenceGap(f"diffs {first}..{sequence} overlap the store's sequence {manifest.sequence}: "
                          f"send {manifest.sequence + 1}..{sequence}")
    return None


def _read_bucket(table_dir: Path, name: str, bucket: int) -> pa.Table:
    files = sorted(bucket_dir(table_dir, bucket).glob("*.parquet"))
    if not files:
        return SCHEMAS[name].empty_table()
    return pa.concat_tables([pq.read_table(f, schema=SCHEMAS[name]) for f in files])


class _NextSnapshot:
    def __init__(self, store: GeometryStore, manifest: Manifest) -> None:
        self.old = store.root / manifest.snapshot
        self.name = f"s{int(manifest.snapshot.lstrip('s')) + 1:06d}"
        self.work = store.root / f".{self.name}.building"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir()
        self.deltas: dict[str, int] = {}
        self.bits = manifest.bits

    def rewrite(self, name: str, buckets: Iterable[int], *, drop_column: str, drop_ids: set[int],
                add: pa.Table) -> pa.Table:
        """Rewrite ``buckets`` of table ``name``: rows whose ``drop_column`` is in ``drop_ids`` go, ``add``
        comes in. Returns the dropped rows (the old state of the changed objects)."""
        old_dir, new_dir = self.old / name, self.work / name
        touched = set(buckets)
        dropped: list[pa.Table] = []
        mask_ids = pa.array(sorted(drop_ids), pa.int64())
        delta = 0
        for bucket in touched:
            current = _read_bucket(old_dir, name, bucket)
            gone = pc.is_in(current[drop_column], value_set=mask_ids)
            dropped.append(current.filter(gone))
            kept = current.filter(pc.invert(gone))
            delta -= current.num_rows - kept.num_rows
            key, _space, _sort = PARTITIONING[name]
            bits = table_bits(name, self.bits)
            incoming = add.filter(pc.equal(pc.shift_right(add[key], pa.scalar(bits, pa.int64())),
                                           pa.scalar(bucket, pa.int64())))
            delta += incoming.num_rows
            merged = pa.concat_tables([kept, incoming.select(SCHEMAS[name].names).cast(SCHEMAS[name])])
            if merged.num_rows:
                write_partitioned(new_dir, merged, name, "00000", bits)
        # Every partition not rewritten is the same file in both snapshots: link it.
        for part_dir in old_dir.glob("bucket=*"):
            if int(part_dir.name.split("=", 1)[1]) in touched:
                continue
            target = new_dir / part_dir.name
            target.mkdir(parents=True, exist_ok=True)
            for f in part_dir.iterdir():
                os.link(f, target / f.name)
        if not has_files(new_dir):
            write_empty(new_dir, name)
        self.deltas[name] = delta
        return pa.concat_tables(dropped) if dropped else SCHEMAS[name].empty_table()


def _way_rows(ways: dict[int, tuple[int, ...]]) -> pa.Table:
    way_id: list[int] = []
    seq: list[int] = []
    node_id: list[int] = []
    for wid, refs in ways.items():
        way_id += [wid] * len(refs)
        seq += range(len(refs))
        node_id += refs
    return pa.table({"way_id": pa.array(way_id, pa.int64()), "seq": pa.array(seq, pa.int32()),
                     "node_id": pa.array(node_id, pa.int64())})


def apply_diff(store: GeometryStore, diff: OscDiff, sequence: int | None = None) -> dict[str, object]:
    """Apply ``diff`` under the store's writer lock; see ``apply_locked``."""
    with store.locked() as manifest:
        return apply_locked(store, manifest, diff, sequence)


def apply_locked(store: GeometryStore, manifest: Manifest, diff: OscDiff,
                 sequence: int | None = None, *, first: int | None = None) -> dict[str, object]:
    """Apply ``diff`` (the caller holds ``store.locked()``, which gave ``manifest``).

    Returns what changed, or ``{"applied": False, "replay": reason}`` for a diff the store already holds.
    Raises SequenceGap (nothing applied) or GeometryStoreError.
    """
    replay = check_sequence(manifest, sequence, diff.sha256, first=first)
    if replay is not None:
        return {"applied": False, "replay": replay.reason, "sequence": manifest.sequence}
    nxt = _NextSnapshot(store, manifest)
    try:
        stats = _write_changes(nxt, diff)
        os.rename(nxt.work, store.root / nxt.name)
    except BaseException:
        shutil.rmtree(nxt.work, ignore_errors=True)
        raise
    counts = dict(manifest.counts)
    for name in ("nodes", "way_nodes", "members"):
        counts[name] = counts.get(name, 0) + nxt.deltas[name]
    entry = {"sequence": sequence, "sha256": diff.sha256}
    if first is not None and first != sequence:
        entry["first_sequence"] = first
    applied = [*manifest.applied, entry]
    new_sequence = sequence if sequence is not None else manifest.sequence
    try:
        write_manifest(store.root, Manifest(snapshot=nxt.name, sequence=new_sequence, counts=counts,
                                            bits=manifest.bits, applied=applied))
    except BaseException:
        shutil.rmtree(store.root / nxt.name, ignore_errors=True)
        raise
    shutil.rmtree(nxt.old, ignore_errors=True)
    return {"applied": True, "sequence": new_sequence, "snapshot": nxt.name, **stats}


def _write_changes(nxt: _NextSnapshot, diff: OscDiff) -> dict[str, int]:
    node_bits, way_bits, rel_bits = (nxt.bits[k] for k in ("node", "way", "relation"))
    live_nodes = {nid: n for nid, n in diff.nodes.items() if not n.deleted}
    nxt.rewrite("nodes", {bucket_of(i, node_bits) for i in diff.nodes}, drop_column="id",
                drop_ids=set(diff.nodes),
                add=pa.table({"id": pa.array(list(live_nodes), pa.int64()),
                              "lon": pa.array([n.lon for n in live_nodes.values()], pa.float64()),
                              "lat": pa.array([n.lat for n in live_nodes.values()], pa.float64())}))
    new_refs = {wid: w.refs for wid, w in diff.ways.items() if not w.deleted}
    old_rows = nxt.rewrite("way_nodes", {bucket_of(i, way_bits) for i in diff.ways}, drop_column="way_id",
                           drop_ids=set(diff.ways), add=_way_rows(new_refs))
    # The reverse index: every partition holding an old or a new (node, way) pair of a changed way.
    pair_nodes = set(old_rows["node_id"].to_pylist()) | {n for refs in new_refs.values() for n in refs}
    pairs = sorted({(n, wid) for wid, refs in new_refs.items() for n in refs})
    nxt.rewrite("node_ways", {bucket_of(n, node_bits) for n in pair_nodes}, drop_column="way_id",
                drop_ids=set(diff.ways),
                add=pa.table({"node_id": pa.array([p[0] for p in pairs], pa.int64()),
                              "way_id": pa.array([p[1] for p in pairs], pa.int64())}))
    rel_id: list[int] = []
    seq: list[int] = []
    mtype: list[str] = []
    mid: list[int] = []
    role: list[str] = []
    for rid, rel in diff.relations.items():
        if rel.deleted:
            continue
        for i, (t, ref, r) in enumerate(rel.members):
            rel_id.append(rid)
            seq.append(i)
            mtype.append(t)
            mid.append(ref)
            role.append(r)
    nxt.rewrite("members", {bucket_of(i, rel_bits) for i in diff.relations}, drop_column="rel_id",
                drop_ids=set(diff.relations),
                add=pa.table({"rel_id": pa.array(rel_id, pa.int64()), "seq": pa.array(seq, pa.int32()),
                              "member_type": pa.array(mtype, pa.string()), "member_id": pa.array(mid, pa.int64()),
                              "role": pa.array(role, pa.string())}))
    return {"nodes": len(diff.nodes), "ways": len(diff.ways), "relations": len(diff.relations)}


def ensure_consistent(store: GeometryStore) -> None:
    """Raise GeometryStoreError when a table of the live snapshot has no files (a damaged store)."""
    manifest = store.manifest()
    for name in SCHEMAS:
        if not has_files(store.table_dir(name, manifest)):
            raise GeometryStoreError(f"{store.root}: table {name} of snapshot {manifest.snapshot} is missing")
