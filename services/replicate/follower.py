"""The replication follower: applies each new diff of a replication directory, in order, through the bridge.

For every sequence after the store's own (its geometry store records the last applied one), the follower
checks that the diff and its state file are there and agree, then calls ``spark.expire`` with the diff,
the store's name and the sequence, and waits for the job: the bridge resolves the diff against the
store, updates the rendering store, publishes the expirations (the queuemaster re-renders) and commits
the geometry store with the sequence. The store is therefore the one record of progress: after a restart
the follower continues from whatever the store says, so no diff is skipped or applied twice (and the
bridge refuses a diff that does not follow the store's sequence).

A missing diff (a gap) or one the bridge cannot read stops the follower with a clear error; the bridge
has applied nothing of that diff. A bridge that is down or slow is not an error: the diff is tried again
at the next poll.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from qbroker import QBrokerError, RequestFailed, Unit
from services.osmstore.geometry import GeometryStore, GeometryStoreError
from services.osmstore.replication import ReplicationError, diff_path, read_state, state_path

log = structlog.get_logger("toposm.replicate")

EXPIRE = "spark.expire"
STATUS_FILE = "replication.json"


@dataclass(frozen=True)
class FollowSettings:
    source: Path
    store: Path
    store_name: str
    start: int | None = None  # the first sequence to apply when the store has none yet
    interval: float = 60.0  # seconds between looks at state.txt
    once: bool = False  # apply what is published, then stop
    min_zoom: int = 10
    max_zoom: int = 18
    call_timeout: float = 3600.0


class Follower:
    """A ``qbroker.runner.Service``: ``start`` launches the follow loop, ``stop`` ends it."""

    def __init__(self, unit: Unit, settings: FollowSettings) -> None:
        self.unit = unit
        self.settings = settings
        self.error: str | None = None
        self.applied: list[int] = []
        self.finished = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="toposm-replicate")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task

    def store_sequence(self) -> int | None:
        try:
            return GeometryStore.of_store(self.settings.store).sequence
        except GeometryStoreError as exc:
            raise ReplicationError(str(exc)) from None

    async def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    await self.catch_up()
                except (QBrokerError, TimeoutError) as exc:
                    if self.settings.once:
                        raise ReplicationError(f"the bridge did not answer: {exc}") from None
                    log.warning("bridge unavailable; trying again at the next poll", error=str(exc)[:300])
                if self.settings.once:
                    break
                try:
                    await asyncio.wait_for(self._stopping.wait(), self.settings.interval)
                except TimeoutError:
                    pass
        except ReplicationError as exc:
            self.error = str(exc)
            log.error("replication stopped", error=self.error)
        finally:
            self.finished.set()

    async def catch_up(self) -> list[int]:
        """Apply every published diff after the store's sequence, in order; returns the sequences applied."""
        s = self.settings
        published = (await asyncio.to_thread(read_state, s.source / "state.txt")).sequence
        current = self.store_sequence()
        if current is None:
            if s.start is None:
                raise ReplicationError(f"{s.store}: the store has no replication sequence yet; "
                                       "pass --start N (the first diff to apply)")
            current = s.start - 1
        done: list[int] = []
        for sequence in range(current + 1, published + 1):
            if self._stopping.is_set():
                break
            await self.apply(sequence, published)
            done.append(sequence)
        return done

    async def apply(self, sequence: int, published: int) -> dict[str, Any]:
        s = self.settings
        diff, state_file = diff_path(s.source, sequence), state_path(s.source, sequence)
        if not diff.is_file():
            raise ReplicationError(f"gap: {diff} is missing (state.txt is at {published}, the store needs "
                                   f"{sequence} next); nothing was applied")
        state = await asyncio.to_thread(read_state, state_file)
        if state.sequence != sequence:
            raise ReplicationError(f"{state_file}: says sequence {state.sequence}, expected {sequence}")
        started = time.monotonic()
        try:
            reply = await self.unit.call(EXPIRE, {
                "paths": [str(diff.resolve())], "store": s.store_name, "sequence": sequence,
                "min_zoom": s.min_zoom, "max_zoom": s.max_zoom, "wait": True,
            }, timeout=s.call_timeout)
        except RequestFailed as exc:  # the bridge refused or the job failed: the diff is not applied
            raise ReplicationError(f"diff {sequence} ({diff}): {exc}") from None
        result = reply.get("result") or {}
        store = result.get("store") or {}
        if not store.get("applied") and "replay" not in store:
            raise ReplicationError(f"diff {sequence} ({diff}): the bridge did not apply it ({store})")
        self.applied.append(sequence)
        await asyncio.to_thread(self._write_status, sequence, state.timestamp, result)
        log.info("diff applied", sequence=sequence, timestamp=state.timestamp, replay=store.get("replay"),
                 metatiles=result.get("total_metatiles"), seconds=round(time.monotonic() - started, 2))
        return dict(result)

    def _write_status(self, sequence: int, timestamp: str | None, result: dict[str, Any]) -> None:
        """For operators: what was applied last (the store's manifest stays the record of progress)."""
        status = {"source": str(self.settings.source), "sequence": sequence, "timestamp": timestamp,
                  "applied_at": time.time(), "metatiles": result.get("total_metatiles"),
                  "inputs": result.get("inputs")}
        path = self.settings.store / STATUS_FILE
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(status, indent=2) + "\n")
        tmp.replace(path)
