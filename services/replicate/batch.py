"""One job's worth of diffs: consecutive replication diffs merged into one sorted osmChange file.

A follower that is behind catches up several diffs per job (each job of the bridge costs seconds whatever
its size; osm2pgsql the same). The diffs are merged with pyosmium's ``MergeInputReader`` in sequence
order and written with ``simplify``: each object once, at its highest version (of equal versions, the
last one read), which is the osmChange reader's rule (``osc_input.supersedes``) that both stores apply, so a
merged diff leaves them in the state the single diffs would. The output is sorted by type and id, as
osm2pgsql requires of its input. This is what ``osm2pgsql-replication update`` does too.

A diff that cannot be had ends the batch before it: the diffs before it are applied, and the next batch
starts with it, so its error (gap, unreadable file, server down) is reported with its own sequence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import osmium
import structlog

from services.osmstore.osc_input import osc_format
from services.osmstore.replication import ReplicationError

from .source import DiffMissing, ReplicationSource, SourceUnavailable

log = structlog.get_logger("toposm.replicate")

MAX_BATCH_BYTES = 64 * 1024 * 1024  # compressed bytes merged in memory per job (pyosmium holds them all)
_SPOOLED = re.compile(r"^\.?\d{9}-\d{9}(\.tmp)?\.osc\.gz$")


@dataclass(frozen=True)
class Batch:
    first: int
    last: int
    path: Path  # the merged osmChange, in the spool
    timestamp: str | None  # the last diff's state timestamp

    @property
    def sequences(self) -> list[int]:
        return list(range(self.first, self.last + 1))

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def clear_spool(spool: Path) -> None:
    """Remove merged diffs left by a follower that stopped mid-job (only files named as this module names them)."""
    spool.mkdir(parents=True, exist_ok=True)
    for leftover in spool.iterdir():
        if _SPOOLED.match(leftover.name):
            leftover.unlink(missing_ok=True)


def build_batch(source: ReplicationSource, first: int, last: int, spool: Path, *, published: int,
                max_bytes: int = MAX_BATCH_BYTES) -> Batch:
    """Fetch diffs ``first..last`` (fewer if one is missing or ``max_bytes`` is reached) and merge them.

    Raises ReplicationError (a gap, a state file that disagrees, an unreadable diff) or SourceUnavailable
    only for ``first``; for a later diff the batch just ends before it."""
    reader = osmium.MergeInputReader()
    total, end, timestamp = 0, first - 1, None
    for sequence in range(first, last + 1):
        try:
            data = source.diff(sequence)
            state = source.state(sequence)
            if state.sequence != sequence:
                raise ReplicationError(f"the state file of diff {sequence} says sequence {state.sequence}")
            if total and total + len(data) > max_bytes:
                break
            try:
                reader.add_buffer(data, osc_format(data))
            except RuntimeError as exc:  # libosmium's gzip and XML errors
                raise ReplicationError(f"diff {sequence} ({source.where(sequence)}): unreadable osmChange "
                                       f"({str(exc)[:200]})") from None
        except DiffMissing as exc:
            if sequence == first:
                raise ReplicationError(f"gap: {exc.where} is missing (state.txt is at {published}, the store "
                                       f"needs {sequence} next); nothing was applied") from None
            break
        except (ReplicationError, SourceUnavailable) as exc:
            if sequence == first:
                raise
            log.warning("batch ends before a diff that cannot be had", sequence=sequence, error=str(exc)[:300])
            break
        total, end, timestamp = total + len(data), sequence, state.timestamp
    spool.mkdir(parents=True, exist_ok=True)
    name = f"{first:09d}-{end:09d}"
    tmp, path = spool / f".{name}.tmp.osc.gz", spool / f"{name}.osc.gz"
    writer = osmium.SimpleWriter(str(tmp), overwrite=True)
    try:
        reader.apply(writer, simplify=True)
    finally:
        writer.close()
    tmp.replace(path)
    return Batch(first, end, path, timestamp)
