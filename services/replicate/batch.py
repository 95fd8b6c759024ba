"""One job's worth of diffs: consecutive replication diffs merged into one sorted osmChange file.

A follower that is behind catches up several diffs per job (each job of the bridge costs seconds whatever
its size; osm2pgsql the same). The diffs are merged with pyosmium's ``MergeInputReader`` in sequence
order and written with ``simplify``: each object once, at its highest version (of equal versions, the
last one read), which is the osmChange reader's rule (``osc_input.supersedes``) that both stores apply, so a
merged diff leaves them in the state the single diffs would. The output is sorted by type and id, as
osm2pgsql requires of its input. This is what ``osm2pgsql-replication update`` does too.

A diff that cannot be had ends the batch before it: the diffs before it are applied, and the next batch
starts with it, so its error (gap, unreadable file, server down) is reported with its own sequence. The
merge holds every object of the batch in memory, so a batch is bounded twice: by the bytes fetched and by
the bytes they inflate to, counted before libosmium sees them (a few KB of gzip can inflate to gigabytes).
"""

from __future__ import annotations

import asyncio
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import osmium
import structlog

from services.osmstore.osc_input import InputLimits, osc_format
from services.osmstore.replication import ReplicationError

from .source import DiffMissing, ReplicationSource, SourceUnavailable

log = structlog.get_logger("toposm.replicate")

MAX_BATCH_BYTES = 64 * 1024 * 1024  # compressed bytes merged in memory per job (pyosmium holds them all)
MAX_BATCH_INFLATED = InputLimits().max_bytes  # the same bytes uncompressed: what the bridge reads of one job
_INFLATE_STEP = 1 << 20  # bytes inflated at a time while counting
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


def inflated_size(data: bytes, limit: int) -> int:
    """How many bytes the osmChange ``data`` (gzip, any number of members, or plain XML) holds uncompressed,
    counted without keeping them and only up to just past ``limit``. Raises zlib.error on a corrupt stream."""
    if osc_format(data) != "osc.gz":
        return len(data)
    size, rest = 0, data
    while rest and size <= limit:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # one gzip member
        chunk = rest
        while chunk and size <= limit:
            size += len(inflate.decompress(chunk, _INFLATE_STEP))
            chunk = inflate.unconsumed_tail
        if not inflate.eof:
            if size <= limit:
                raise zlib.error("truncated gzip stream")
            break
        rest = inflate.unused_data
    return size


async def build_batch(
    source: ReplicationSource,
    first: int,
    last: int,
    spool: Path,
    *,
    published: int,
    max_bytes: int = MAX_BATCH_BYTES,
    max_inflated: int = MAX_BATCH_INFLATED,
) -> Batch:
    """Fetch diffs ``first..last`` (fewer if one is missing, or ``max_bytes`` fetched or ``max_inflated``
    uncompressed would be passed) and merge them. Downloads run on the loop (cancelled at once); counting,
    parsing and writing, bounded by the caps, in a thread.

    Raises ReplicationError (a gap, a state file that disagrees, an unreadable diff, one diff over
    ``max_inflated`` alone) or SourceUnavailable only for ``first``; for a later diff the batch just ends
    before it."""
    reader = osmium.MergeInputReader()
    total, inflated, end, timestamp = 0, 0, first - 1, None
    for sequence in range(first, last + 1):
        try:
            data = await source.diff(sequence)
            state = await source.state(sequence)
            if state.sequence != sequence:
                raise ReplicationError(f"the state file of diff {sequence} says sequence {state.sequence}")
            if total and total + len(data) > max_bytes:
                break
            size = await asyncio.to_thread(
                _add_diff, reader, data, source.where(sequence), sequence, max_inflated - inflated, max_inflated
            )
            if size is None:
                break
        except DiffMissing as exc:
            if sequence == first:
                raise ReplicationError(
                    f"gap: {exc.where} is missing (state.txt is at {published}, the store "
                    f"needs {sequence} next); nothing was applied"
                ) from None
            break
        except (ReplicationError, SourceUnavailable) as exc:
            if sequence == first:
                raise
            log.warning("batch ends before a diff that cannot be had", sequence=sequence, error=str(exc)[:300])
            break
        total, inflated, end, timestamp = total + len(data), inflated + size, sequence, state.timestamp
    path = await asyncio.to_thread(_write_merged, reader, spool, f"{first:09d}-{end:09d}")
    return Batch(first, end, path, timestamp)


def _add_diff(
    reader: osmium.MergeInputReader, data: bytes, where: str, sequence: int, room: int, max_inflated: int
) -> int | None:
    """Add one diff to the merge; its inflated size, or None when it would take the batch past ``room``."""
    try:
        size = inflated_size(data, max_inflated)
        if size > max_inflated:
            raise ReplicationError(
                f"diff {sequence} ({where}): over {max_inflated} bytes uncompressed, more than a job reads; not applied"
            )
        if size > room:
            return None
        reader.add_buffer(data, osc_format(data))
    except (RuntimeError, zlib.error) as exc:  # libosmium's gzip and XML errors, a corrupt gzip stream
        raise ReplicationError(f"diff {sequence} ({where}): unreadable osmChange ({str(exc)[:200]})") from None
    return size


def _write_merged(reader: osmium.MergeInputReader, spool: Path, name: str) -> Path:
    spool.mkdir(parents=True, exist_ok=True)
    tmp, path = spool / f".{name}.tmp.osc.gz", spool / f"{name}.osc.gz"
    writer = osmium.SimpleWriter(str(tmp), overwrite=True)
    try:
        reader.apply(writer, simplify=True)
    finally:
        writer.close()
    tmp.replace(path)
    return path
