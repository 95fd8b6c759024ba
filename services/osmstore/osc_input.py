"""An osmChange file read as untrusted input: bounded in size, cancellable, errors that never quote it.

Both readers of a job's diffs (the Spark bridge's ``osc_reader`` and the geometry store's ``osc_diff``)
iterate the file's objects through ``osm_objects``:

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
_BLOCK = 1 << 20
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


def _compressed(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _count_bytes(path: Path, name: str, budget: InputBudget, check: Callable[[InputBudget], None]) -> bool:
    """Add the file's decompressed size to the budget (refusing past the cap); True when gzip."""
    if budget.limits is None:
        return _compressed(path)
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
        raise InputTooLarge(f"{name}: the job's osmChange input is over {limit} bytes decompressed "
                            f"(max_input_bytes={limit})")
    return _compressed(path)


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


def osm_objects(path: Path, name: str, budget: InputBudget, check: Callable[[InputBudget], None],
                entities: Any = osmium.osm.ALL) -> Iterator[Any]:
    """The objects of one osmChange file, within ``budget``; raises InputTooLarge or UnreadableOsc."""
    last: tuple[str, int] | None = None
    try:
        gz = _count_bytes(path, name, budget, check)
        limit = budget.limits.max_objects if budget.limits is not None else None
        for obj in osmium.FileProcessor(osmium.io.File(str(path), "osc.gz" if gz else "osc"), entities):
            budget.objects += 1
            if limit is not None and budget.objects > limit:
                raise InputTooLarge(f"{name}: the job's osmChange input holds more than {limit} objects "
                                    f"(max_input_objects={limit})")
            if budget.objects % CHECK_EVERY == 0:
                check(budget)
            last = (obj.type_str(), obj.id)
            yield obj
    except InputTooLarge:
        raise
    except (RuntimeError, ValueError, OSError, EOFError, zlib.error, osmium.InvalidLocationError) as exc:
        raise UnreadableOsc(describe_error(name, exc, last)) from None
