"""The store expiry job as the tests run it (``run``), and what the extract says a change must expire: the
ways and relations it touches, their geometry before and after (checked with ``store_oracle``).
"""

from __future__ import annotations

from pathlib import Path

from store_oracle import Expected

from harness.osm import Extract
from services.spark_bridge.expire_job import ExpireParams
from services.spark_bridge.job_context import JobContext
from services.spark_bridge.store_job import StoreJob, run_store_expire

MIN_Z, MAX_Z = 13, 17


def run(spark, store: Path, diff: Path, sequence: int | None = None, apply: bool = True):
    published: list[str] = []
    ctx = JobContext("test", spark, None, publish=published.append)
    result = run_store_expire(diff, StoreJob(store, sequence, apply), ExpireParams(MIN_Z, MAX_Z), ctx)
    return result, {t for m in published for t in m.split(";")}


def assert_expires(published: set[str], expected: Expected) -> None:
    must, may = expected.metatiles(MIN_Z)
    assert must <= published, sorted(must - published)[:10]
    assert published <= may, sorted(published - may)[:10]


def coords(extract: Extract, refs: list[int], moved: dict[int, tuple[float, float]] | None = None) -> list:
    located = {**extract.nodes, **(moved or {})}
    return [located[r] for r in refs if r in located]


def whole_ways(extract: Extract, **want: str) -> list[int]:
    return sorted(
        w
        for w, (refs, tags) in extract.ways.items()
        if all(tags.get(k) == v for k, v in want.items()) and all(r in extract.nodes for r in refs)
    )


_USERS: dict[int, dict[int, list[int]]] = {}


def users(extract: Extract, node: int) -> list[int]:
    """Ways using ``node`` (an index built once per extract: a scan per node would dominate the test)."""
    index = _USERS.get(id(extract))
    if index is None:
        index = _USERS[id(extract)] = {}
        for w, (refs, _) in extract.ways.items():
            for r in dict.fromkeys(refs):
                index.setdefault(r, []).append(w)
    return index.get(node, [])


_PARENTS: dict[int, dict[tuple[str, int], list[int]]] = {}


def parents(extract: Extract, ways: set[int] | list[int], nodes: set[int] | list[int] = ()) -> set[int]:
    """The relations osm2pgsql re-processes for changed ``ways`` and moved ``nodes``: those with one of the
    ways as a member, or one of the nodes (as a member or through a way using it)."""
    index = _PARENTS.get(id(extract))
    if index is None:
        index = _PARENTS[id(extract)] = {}
        for r, (members, _) in extract.relations.items():
            for t, ref, _ in members:
                index.setdefault((t, ref), []).append(r)
    via = {w for n in nodes for w in users(extract, n)}
    return {r for w in {*ways, *via} for r in index.get(("w", w), ())} | {
        r for n in nodes for r in index.get(("n", n), ())
    }


def expect_relations(
    expected: Expected, extract: Extract, relations: set[int], moved: dict[int, tuple[float, float]] | None = None
) -> set[int]:
    """Each relation's member ways, old and new line (osm2pgsql draws a relation from its ways); returns them."""
    ways: set[int] = set()
    for r in relations:
        for t, ref, _ in extract.relations[r][0]:
            if t == "w":
                if ref in extract.ways:  # the store has the extract's ways, no others
                    ways.add(ref)
                    expected.line(coords(extract, extract.ways[ref][0]), MAX_Z)
                    expected.line(coords(extract, extract.ways[ref][0], moved), MAX_Z)
    return ways
