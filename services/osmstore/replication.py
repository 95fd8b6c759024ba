"""A replication directory laid out as OpenStreetMap publishes them (planet.openstreetmap.org/replication).

    state.txt                 the newest sequence published (``sequenceNumber=``, ``timestamp=``)
    000/000/001.osc.gz        the diff of sequence 1
    000/000/001.state.txt     its state file (the same two keys)

Sequence numbers are 9 digits split 3/3/3. State files are Java properties: ``key=value`` lines, ``#``
comments, ``\\:`` escapes in the timestamp.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_SEQUENCE = 999_999_999
STATE_BYTES = 64 * 1024  # a state file is a few lines; anything bigger is not one
# ASCII digits only, at most MAX_SEQUENCE's nine after any leading zeros: str.isdigit() takes "²" and
# int() refuses it, and int() refuses 5,000 digits too (a ValueError, not a malformed state file).
_SEQUENCE = re.compile(r"0*[0-9]{1,9}")


class ReplicationError(Exception):
    """The replication directory cannot be followed (gap, corrupt file); the message says which file."""


@dataclass(frozen=True)
class ReplicationState:
    sequence: int
    timestamp: str | None


def _parts(sequence: int) -> tuple[str, str, str]:
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise ReplicationError(f"sequence {sequence} is outside 0..{MAX_SEQUENCE}")
    text = f"{sequence:09d}"
    return text[0:3], text[3:6], text[6:9]


def diff_path(source: Path, sequence: int) -> Path:
    a, b, c = _parts(sequence)
    return source / a / b / f"{c}.osc.gz"


def state_path(source: Path, sequence: int) -> Path:
    a, b, c = _parts(sequence)
    return source / a / b / f"{c}.state.txt"


def read_state(path: Path) -> ReplicationState:
    """Parse a state file; raises ReplicationError naming the file when it is missing or malformed."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(STATE_BYTES + 1)
    except OSError as exc:
        raise ReplicationError(f"{path}: cannot read the state file ({exc.strerror or exc})") from None
    return parse_state(raw, str(path))


def parse_state(raw: bytes, where: str) -> ReplicationState:
    """Parse the bytes of a state file read from ``where`` (a path or a URL, for the message)."""
    if len(raw) > STATE_BYTES:
        raise ReplicationError(f"{where}: too big for a state file")
    values: dict[str, str] = {}
    for line in raw.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values[key.strip()] = value.strip().replace("\\:", ":")
    number = values.get("sequenceNumber", "")
    if not _SEQUENCE.fullmatch(number):
        raise ReplicationError(f"{where}: no valid sequenceNumber")
    return ReplicationState(int(number), values.get("timestamp"))


def write_state(path: Path, state: ReplicationState) -> None:
    """Write a state file as osmosis does (used to publish diffs, e.g. by the demo and the tests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = (state.timestamp or "").replace(":", "\\:")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"#{state.timestamp or ''}\nsequenceNumber={state.sequence}\ntimestamp={stamp}\n")
    tmp.replace(path)


def publish_diff(source: Path, sequence: int, data: bytes, timestamp: str) -> Path:
    """Publish ``data`` (the .osc.gz bytes) as diff ``sequence`` the way OSM does: the diff and its state file
    first, the top-level ``state.txt`` last, so a follower never sees a sequence whose diff is not there yet
    (the demo and the tests play a replication server with it)."""
    path = diff_path(source, sequence)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    write_state(state_path(source, sequence), ReplicationState(sequence, timestamp))
    write_state(source / "state.txt", ReplicationState(sequence, timestamp))
    return path
