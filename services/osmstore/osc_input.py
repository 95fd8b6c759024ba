"""The osmChange reader: every osmChange file the project reads goes through here.

It owns what all of them share; the rest is an adapter on it that keeps what it needs of each object:

- the file opener (``osc_file``): .osc or .osc.gz, told from the content, never the name;
- the version rule (``supersedes``): when an object appears more than once (a minutely diff may carry
  several versions, a merged one in any order), the highest version wins and of equal versions the last
  one read;
- the objects, read as untrusted input (``osm_objects``): bounded in size, cancellable, errors that never
  quote the file.

Adapters: the geometry store's ``osc_diff.read_diff``, the rendering store's ``render_store.apply_osc`` and
the Spark expiry job's ``spark_bridge.osc_reader.read_osc``. ``osm_objects``:

- decompressed bytes are counted first, in blocks (a 6.7 MB ``.osc.gz`` may hold 50 million nodes, 3 GB
  of XML): past ``max_bytes`` for the job the file is refused before libosmium parses any of it;
- objects are counted as they are read: past ``max_objects`` the reading stops, so the driver holds at
  most that many objects whatever the file holds;
- ``check`` is called every CHECK_EVERY objects (and every block while counting): a job's cancel takes
  effect there, and progress counters are updated;
- libosmium's messages quote the offending value (``wrong format for coordinate: 'SECRET...'``): the
  error names the file as the caller gave it, the line where libosmium knows it, the last object read
  before the problem, and the kind of problem, never the content.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import osmium

CHECK_EVERY = 10_000
OSC_SUFFIXES = (".osc", ".osc.gz")  # what job inputs call an osmChange (the format is still read from the content)
GZIP_MAGIC = b"\x1f\x8b"
_BLOCK = 1 << 20
_SNIFF_BYTES = 4096
# expat's messages are fixed texts ("not well-formed (invalid token)"); only that shape is passed on.
_XML_ERROR = re.compile(r"^XML parsing error at line (\d+), column (\d+): ([a-z ()-]{1,80})$")
# libosmium's value errors: "<problem>: '<the value>'"; the problem is kept, the value never.
_VALUE_ERROR = re.compile(r"^([A-Za-z][A-Za-z ]{0,60}): '")
_TYPES = {"n": "node", "w": "way", "r": "relation", "c": "changeset"}


@dataclass(frozen=True)
class InputLimits:
    """What one job may read of osmChange input, all its files together."""

    max_bytes: int = 2 << 30  # decompressed; a planet day's diff is about 1.5 GB of XML
    max_objects: int = 10_000_000  # a planet day's diff is a few million

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_objects < 1:
            raise ValueError("input limits must be at least 1")


class InputTooLarge(ValueError):
    """The job's input is over one of its InputLimits; the message names the limit."""


class UnreadableOsc(ValueError):
    """The file is not a readable osmChange; the message names the file and the problem, not the content."""


@dataclass
class InputBudget:
    """What a job has read so far (shared by its files)."""

    limits: InputLimits | None  # None: unbounded (the operator's own files), nothing counted up front
    bytes: int = 0
    objects: int = 0


def supersedes(version: int, known: int | None) -> bool:
    """The version rule: does ``version`` of an object replace the ``known`` one read before it (None: none)?
    The highest version wins; of equal versions the last one read."""
    return known is None or version >= known


def osc_format(head: bytes) -> str:
    """libosmium's format name for osmChange data starting with ``head``: gzip or plain XML."""
    return "osc.gz" if head.startswith(GZIP_MAGIC) else "osc"


def _compressed(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def osc_file(path: Path) -> osmium.io.File:
    """The file as libosmium opens it: compression told from the content (a replication spool's names lie)."""
    return osmium.io.File(str(path), "osc.gz" if _compressed(path) else "osc")


def sniff_osc(path: Path, name: str) -> None:
    """Cheap submit-time check that ``path`` looks like an osmChange document; raises UnreadableOsc."""
    try:
        opener = gzip.open if _compressed(path) else open
        with opener(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise UnreadableOsc(f"{name}: cannot read ({type(exc).__name__})") from None
    if b"<osmChange" not in head:
        raise UnreadableOsc(f"{name}: not an osmChange document (no <osmChange> element)")


def _count_bytes(path: Path, name: str, budget: InputBudget, check: Callable[[InputBudget], None]) -> None:
    """Add the file's decompressed size to the budget (refusing past the cap)."""
    if budget.limits is None:
        return
    limit = budget.limits.max_bytes
    if not _compressed(path):
        budget.bytes += path.stat().st_size
    else:
        with gzip.open(path, "rb") as fh:
            while block := fh.read(_BLOCK):  # bounded memory: one block at a time
                budget.bytes += len(block)
                if budget.bytes > limit:
                    break
                check(budget)
    if budget.bytes > limit:
        raise InputTooLarge(
            f"{name}: the job's osmChange input is over {limit} bytes decompressed (max_input_bytes={limit})"
        )


def describe_error(name: str, exc: BaseException, last: tuple[str, int] | None) -> str:
    """``name: unparsable osmChange: <kind of problem>[ at line L, column C][ (after <last object read>)]``,
    no content."""
    text = str(exc)
    if xml := _XML_ERROR.match(text):
        problem = f"not well-formed XML at line {xml[1]}, column {xml[2]} ({xml[3]})"
    elif value := _VALUE_ERROR.match(text):
        problem = value[1]
    elif isinstance(exc, OSError | EOFError | zlib.error):
        return f"{name}: cannot read ({type(exc).__name__})"
    else:
        problem = type(exc).__name__
    after = f" (after {_TYPES.get(last[0], last[0])} {last[1]})" if last else ""
    return f"{name}: unparsable osmChange: {problem}{after}"


def _unchecked(_: InputBudget) -> None:
    pass


def osm_objects(
    path: Path,
    name: str,
    budget: InputBudget | None = None,
    check: Callable[[InputBudget], None] | None = None,
    entities: Any = osmium.osm.ALL,
) -> Iterator[Any]:
    """The objects of one osmChange file in file order, every version (adapters pick with ``supersedes``),
    within ``budget`` (None: unbounded); raises InputTooLarge or UnreadableOsc. An object is valid only
    until the next one is read (libosmium reuses its buffers): keep what you need of it, not the object."""
    budget = InputBudget(None) if budget is None else budget
    check = check or _unchecked
    last: tuple[str, int] | None = None
    try:
        _count_bytes(path, name, budget, check)
        limit = budget.limits.max_objects if budget.limits is not None else None
        for obj in osmium.FileProcessor(osc_file(path), entities):
            budget.objects += 1
            if limit is not None and budget.objects > limit:
                raise InputTooLarge(
                    f"{name}: the job's osmChange input holds more than {limit} objects (max_input_objects={limit})"
                )
            if budget.objects % CHECK_EVERY == 0:
                check(budget)
            last = (obj.type_str(), obj.id)
            yield obj
    except InputTooLarge:
        raise
    except (RuntimeError, ValueError, OSError, EOFError, zlib.error, osmium.InvalidLocationError) as exc:
        raise UnreadableOsc(describe_error(name, exc, last)) from None
